"""The Grafana dashboards (atom_operator.dashboards): the committed JSON is what the code generates, in Grafana's
shape; every query parses as PromQL (promtool), names only metrics the engine or the operator serves
(tests/observability/served.py) and matches, groups and lists only labels those metrics' series carry once
scraped as the chart's PodMonitor and ServiceMonitor scrape them; the chart ships each as a ConfigMap for
Grafana's sidecar, off by default. Each check is shown to fail on a query that breaks it."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from atom_operator.dashboards import DASHBOARDS
from atom_operator.dashboards.__main__ import main
from atom_operator.dashboards.grafana import DATASOURCE, GRID_COLUMNS

from tests.observability import served
from tests.observability.crds import CHART, of_kind, render
from tests.observability.promql import names

REPO = CHART.parents[1]
JSON_DIR = CHART / "dashboards"
DOC = REPO / "docs" / "observability.md"
# Concrete values for the variables, as Grafana substitutes them before it sends a query.
VALUES = {"namespace": "llm", "atomdeployment": "chat", "role": "decode", "__rate_interval": "1m"}
# The labels prometheus-operator gives every target it generates from a PodMonitor (and from a ServiceMonitor,
# with its Service's name): a series keeps them beside its own (the engine's and the operator's honorLabels only
# decide which wins where both have one).
TARGET_LABELS = frozenset({"namespace", "pod", "container", "endpoint", "instance", "job"})
SERVICE_TARGET_LABELS = TARGET_LABELS | {"service"}
Served = dict[str, frozenset[str]]
# An aggregation without by (...) keeps no label.
AGGREGATIONS = {"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile"}


def dashboards() -> dict[str, dict[str, Any]]:
    return {d.uid: d.json() for d in DASHBOARDS}


def concrete(expr: str) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: VALUES[m.group(1)], expr)


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(where, expr, legend) of every panel target, and of every query variable (its ``label_values`` selector,
    the listed label as its legend)."""
    out = []
    for p in dashboard["panels"]:
        out += [(f"{dashboard['uid']} panel {p['title']!r} {t['refId']}", t["expr"], t["legendFormat"])
                for t in p["targets"]]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", v["definition"]).groups()
            out.append((f"{dashboard['uid']} variable {v['name']}", selector, f"{{{{{label}}}}}"))
    return out


@pytest.fixture(scope="module")
def series() -> Served:
    """Every served sample name with the labels its series carry once scraped through the chart's monitors."""
    docs = render({"monitoring": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}})
    (pod_monitor,) = of_kind(docs, "PodMonitor")
    (service_monitor,) = of_kind(docs, "ServiceMonitor")

    def relabeled(endpoints: list[dict]) -> frozenset[str]:
        return frozenset(r["targetLabel"] for e in endpoints for r in e.get("relabelings", []))

    engine_labels = TARGET_LABELS | relabeled(pod_monitor["spec"]["podMetricsEndpoints"])
    operator_labels = SERVICE_TARGET_LABELS | relabeled(service_monitor["spec"]["endpoints"])
    engine, operator = served.engine(), served.operator()
    assert not engine.keys() & operator.keys()
    return {**{n: ls | engine_labels for n, ls in engine.items()},
            **{n: ls | operator_labels for n, ls in operator.items()}}


def problems(dashboard: dict[str, Any], series: Served) -> list[str]:
    """What in ``dashboard``'s queries no served series has: a metric, or a label a selector matches on, a
    grouping names or a legend shows."""
    out = []
    for where, expr, legend in queries(dashboard):
        found = names(concrete(expr))
        if not found.metrics:
            out.append(f"{where}: names no metric (the tokenizer missed it?)")
        for metric in sorted(found.metrics - series.keys()):
            out.append(f"{where}: {metric} is not served")
        known = [series[m] for m in found.metrics if m in series]
        for metric, labels in found.matched.items():
            out += [f"{where}: {metric} has no label {label}" for label in sorted(labels - series.get(metric, labels))]
        for label in sorted(found.grouped):
            out += [f"{where}: groups by {label}, which {m} lacks" for m in sorted(found.metrics & series.keys())
                    if label not in series[m]]
        if found.grouped or found.functions & AGGREGATIONS:
            shown = found.grouped
        else:
            shown = frozenset.intersection(*known) if known else frozenset()
        out += [f"{where}: the legend shows {label}, which the result has not"
                for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend) if label not in shown]
    return out


def with_expr(dashboard: dict[str, Any], expr: str) -> dict[str, Any]:
    """``dashboard`` with its first panel's first target replaced by ``expr``."""
    out = copy.deepcopy(dashboard)
    out["panels"][0]["targets"][0]["expr"] = expr
    return out


def promtool(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool is missing: run make prereqs (Debian's prometheus package)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def rules_file(path: Path, all_queries: dict[str, list[tuple[str, str, str]]]) -> Path:
    """Each query, its variables replaced, as a recording rule: ``promtool check rules`` parses every expr."""
    groups = [{"name": uid, "rules": [{"record": f"dashboard:{uid.replace('-', '_')}:q{i}", "expr": concrete(expr)}
                                      for i, (_, expr, _) in enumerate(qs)]} for uid, qs in all_queries.items()]
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


# ---- generated and committed ---------------------------------------------------------------------------------
def test_the_committed_dashboards_and_their_doc_tables_are_generated() -> None:
    assert main(["--check", str(JSON_DIR), str(DOC)]) == 0, "stale: run make dashboards"
    assert sorted(p.name for p in JSON_DIR.glob("*.json")) == sorted(f"{uid}.json" for uid in dashboards())


def test_the_freshness_check_finds_a_stale_file(tmp_path: Path) -> None:
    shutil.copytree(JSON_DIR, tmp_path / "d")
    (tmp_path / "doc.md").write_text(DOC.read_text())
    assert main(["--check", str(tmp_path / "d"), str(tmp_path / "doc.md")]) == 0
    stale = tmp_path / "d" / "atom-engine.json"
    stale.write_text(stale.read_text().replace("vllm:num_requests_running", "vllm:num_requests_runing"))
    assert main(["--check", str(tmp_path / "d"), str(tmp_path / "doc.md")]) == 1
    assert main([str(tmp_path / "d"), str(tmp_path / "doc.md")]) == 0  # make dashboards mends it
    assert main(["--check", str(tmp_path / "d"), str(tmp_path / "doc.md")]) == 0


# ---- Grafana's shape ----------------------------------------------------------------------------------------
def test_the_four_dashboards_each_have_the_namespace_deployment_and_role_variables() -> None:
    boards = dashboards()
    assert set(boards) == {"atom-engine", "atom-pd", "atom-autoscaler", "atom-operator"}
    for d in boards.values():
        variables = d["templating"]["list"]
        assert [v["name"] for v in variables] == ["datasource", "namespace", "atomdeployment", "role"]
        assert variables[0]["type"] == "datasource" and variables[0]["query"] == "prometheus"
        assert all(v["datasource"] == DATASOURCE for v in variables[1:])
        assert DATASOURCE == {"type": "prometheus", "uid": "${datasource}"}


@pytest.mark.parametrize("uid", [d.uid for d in DASHBOARDS])
def test_each_dashboard_has_grafanas_shape(uid: str) -> None:
    d = dashboards()[uid]
    assert isinstance(d["schemaVersion"], int) and d["title"] and d["panels"]
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= GRID_COLUMNS and g["h"] > 0, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        assert p["datasource"] == DATASOURCE and p["targets"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE and t["expr"]
            used = set(re.findall(r"\$\{?(\w+)", t["expr"]))
            assert used <= {v["name"] for v in d["templating"]["list"]} | {"__rate_interval"}, t["expr"]


# ---- the queries ---------------------------------------------------------------------------------------------
def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    boards = dashboards()
    path = rules_file(tmp_path / "rules.yaml", {uid: queries(d) for uid, d in boards.items()})
    out = promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {sum(len(queries(d)) for d in boards.values())} rules found" in out.stdout


def test_promtool_refuses_a_broken_query(tmp_path: Path) -> None:
    broken = with_expr(dashboards()["atom-engine"], "sum by (pod) (rate(vllm:prompt_tokens_total[$__rate_interval])")
    path = rules_file(tmp_path / "rules.yaml", {"atom-engine": queries(broken)})
    assert promtool("check", "rules", str(path)).returncode != 0


@pytest.mark.parametrize("uid", [d.uid for d in DASHBOARDS])
def test_every_metric_and_label_a_query_names_is_served(uid: str, series: Served) -> None:
    assert problems(dashboards()[uid], series) == []


@pytest.mark.parametrize(("expr", "problem"), [
    # Names peers' dashboards query that no longer exist (production-stack, llm-d).
    ("sum(rate(vllm:gpu_prefix_cache_hits_total[$__rate_interval]))", "vllm:gpu_prefix_cache_hits_total is not served"),
    ("sum(rate(vllm:num_preemptions[$__rate_interval]))", "vllm:num_preemptions is not served"),
    # A served name matched on, grouped by or shown with a label its series do not carry.
    ('max(atom_deployment_condition{role=~"$role"})', "atom_deployment_condition has no label role"),
    ("sum by (atomdeployment) (rate(atom_autoscaler_decisions_total[$__rate_interval]))",
     "groups by atomdeployment, which atom_autoscaler_decisions_total lacks"),
    ("sum(vllm:num_requests_running)", "the legend shows atomdeployment, which the result has not"),
])
def test_a_query_naming_what_is_not_served_is_caught(expr: str, problem: str, series: Served) -> None:
    found = problems(with_expr(dashboards()["atom-engine"], expr), series)
    assert any(problem in p for p in found), found


def test_the_tokenizer_reads_metrics_matchers_and_groupings() -> None:
    found = names('sum by (pod) (rate(a:b_total{x="{1}", y=~"p|q"}[5m])) / on (pod) group_left (z) c_total > 1e3'
                  ' and ignoring (w) d unless max(e{v!="s"}) offset 5m')
    assert found.metrics == {"a:b_total", "c_total", "d", "e"}
    assert found.matched == {"a:b_total": {"x", "y"}, "c_total": set(), "d": set(), "e": {"v"}}
    assert found.grouped == {"pod", "z", "w"}
    assert found.functions == {"sum", "rate", "max"}


def test_the_served_names_come_from_the_real_endpoints(series: Served) -> None:
    """The reference the checks use holds what the engine and the operator render: a histogram's series and a
    counter's _total, vLLM's labels, the operator's per-deployment labels, the PodMonitor's relabeled labels."""
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
            "vllm:num_preemptions_total", "atom_operator_reconciles_total"} <= series.keys()
    assert "vllm:num_preemptions" not in series
    assert {"le", "model_name", "engine", "atomdeployment", "role", "pod"} <= \
        series["vllm:time_to_first_token_seconds_bucket"]
    assert {"namespace", "atomdeployment", "type", "status"} <= series["atom_deployment_condition"]
    assert "role" not in series["atom_deployment_condition"]


# ---- the chart -----------------------------------------------------------------------------------------------
def configmaps(values: dict[str, Any]) -> list[dict]:
    return [c for c in of_kind(render({"monitoring": {"dashboards": values}}), "ConfigMap")
            if c["metadata"]["name"].endswith("-dashboard")]


def test_the_chart_ships_no_dashboards_by_default() -> None:
    assert configmaps({}) == []


def test_the_chart_ships_each_dashboard_as_a_configmap_for_grafanas_sidecar() -> None:
    maps = configmaps({"enabled": True})
    assert len(maps) == len(DASHBOARDS)
    shipped = {}
    for c in maps:
        assert c["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert c["metadata"]["namespace"] == "monitoring-test"  # the release's
        (key, text), = c["data"].items()
        shipped[key] = json.loads(text)
    assert shipped == {p.name: json.loads(p.read_text()) for p in JSON_DIR.glob("*.json")}


def test_the_sidecars_label_namespace_and_annotations_are_configurable() -> None:
    maps = configmaps({"enabled": True, "label": "grafana.example/dashboard", "labelValue": "atom",
                       "namespace": "grafana", "annotations": {"grafana_folder": "ATOM"}})
    for c in maps:
        assert c["metadata"]["labels"]["grafana.example/dashboard"] == "atom"
        assert "grafana_dashboard" not in c["metadata"]["labels"]
        assert c["metadata"]["namespace"] == "grafana"
        assert c["metadata"]["annotations"] == {"grafana_folder": "ATOM"}
