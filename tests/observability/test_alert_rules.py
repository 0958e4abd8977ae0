"""The chart's PrometheusRule (monitoring.prometheusRule): off by default, accepted by prometheus-operator's real
CRD schema, its rules valid for ``promtool check rules``, and each alert unit-tested with ``promtool test rules``
(Debian's prometheus package, hack/prereqs.sh): input series that make it fire, with the labels and summary it
fires with, and series close to them that must not. An alert added to the chart without a case here fails."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from atom_engine import buckets

from tests.observability.crds import CHART, of_kind, render, validate

ON = {"monitoring": {"prometheusRule": {"enabled": True}}}
ENGINE = 'namespace="llm", atomdeployment="chat"'
POD = f'{ENGINE}, role="decode", pod="chat-decode-0", model_name="m", engine="0"'


def series(name: str, labels: str, values: str) -> dict:
    return {"series": f"{name}{{{labels}}}", "values": values}


# The operator's series as its ServiceMonitor labels them: the target's namespace and pod, and (honorLabels) the
# AtomDeployment's own namespace on the atom_deployment_* and atom_autoscaler_* series.
OPERATOR = 'namespace="atom-system", pod="atom-operator-{}"'
DEPLOYMENT_SERIES = f'{ENGINE}, pod="atom-operator-0"'


def condition(type_: str, status: str, values: str) -> list[dict]:
    """atom_deployment_condition of one type, as the operator writes it: ``values`` (of 1s and 0s: "1x20",
    "1x2 0x18") for ``status``, the opposite for the other of True and False, Unknown at 0."""
    def each(bit: Callable[[int], int]) -> str:
        return " ".join(f"{bit(int(v[0]))}{v[1:]}" for v in values.split())

    other = "False" if status == "True" else "True"
    return [series("atom_deployment_condition", f'{DEPLOYMENT_SERIES}, type="{type_}", status="{s}"', each(bit))
            for s, bit in ((status, lambda b: b), (other, lambda b: 1 - b), ("Unknown", lambda b: 0))]


def limited(reason: str, status: str) -> list[dict]:
    """ScalingLimited held at ``status`` with ``reason`` for 30 minutes."""
    return [*condition("ScalingLimited", status, "1x40"), series(
        "atom_deployment_condition_reason", f'{DEPLOYMENT_SERIES}, type="ScalingLimited", reason="{reason}"', "1x40")]


def slo_case(histogram: str, le: str) -> tuple:
    """Half the observations above the SLO's bound (fires), then 1% (within a 0.99 objective: quiet)."""
    def load(good_per_minute: int) -> list[dict]:
        return [series(f"{histogram}_bucket", f'{POD}, le="{le}"', f"0+{good_per_minute}x20"),
                series(f"{histogram}_count", POD, "0+100x20")]

    return "10m", {"namespace": "llm", "atomdeployment": "chat", "severity": "critical"}, load(50), load(99)


# alert -> (eval time, the labels it fires with, the series that make it fire, series that must not)
CASES = {
    # Prometheus 3 writes a bound of 1.0 as "1"; the rules match either spelling (here: as prometheus_client writes).
    "AtomTTFTSLOBurn": slo_case("vllm:time_to_first_token_seconds", "2.5"),
    "AtomITLSLOBurn": slo_case("vllm:inter_token_latency_seconds", "0.2"),
    "AtomQueueGrowing": (
        "30m", {"namespace": "llm", "atomdeployment": "chat", "role": "decode", "severity": "warning"},
        [series("vllm:num_requests_waiting", POD, "0+1x40")],
        [series("vllm:num_requests_waiting", POD, "20x40")],  # long, but not growing
    ),
    "AtomKVCacheSaturated": (
        "20m", {"namespace": "llm", "atomdeployment": "chat", "role": "decode", "pod": "chat-decode-0",
                "severity": "warning"},
        [series("vllm:kv_cache_usage_perc", POD, "0.99x30")],
        [series("vllm:kv_cache_usage_perc", POD, "0.5x30")],
    ),
    "AtomPrefillBreakerOpen": (
        "5m", {"namespace": "llm", "atomdeployment": "chat", "pod": "chat-decode-0", "severity": "critical"},
        [series("atom:pd_breaker_state", POD, "2x10")],
        [series("atom:pd_breaker_state", POD, "1x10")],  # half-open: probing
    ),
    "AtomKVFetchFailures": (
        "15m", {"namespace": "llm", "atomdeployment": "chat", "severity": "warning"},
        [series("atom:pd_fetch_failures_total", POD, "0+10x30"),
         series("atom:pd_fetch_attempts_total", POD, "0+100x30")],
        [series("atom:pd_fetch_failures_total", POD, "0+1x30"),
         series("atom:pd_fetch_attempts_total", POD, "0+100x30")],
    ),
    "AtomEnginePodNotReady": (
        "15m", {"namespace": "llm", "pod": "chat-decode-0", "severity": "warning"},
        [series("kube_pod_status_ready", 'namespace="llm", pod="chat-decode-0", condition="true"', "0x20"),
         series("kube_pod_labels", 'namespace="llm", pod="chat-decode-0", label_app_kubernetes_io_name="atom-engine",'
                ' label_app_kubernetes_io_component="decode"', "1x20")],
        # A compile Job's pod (never Ready: it runs to completion) and a Ready engine pod.
        [series("kube_pod_status_ready", 'namespace="llm", pod="chat-build-x", condition="true"', "0x20"),
         series("kube_pod_labels", 'namespace="llm", pod="chat-build-x", label_app_kubernetes_io_name="atom-engine",'
                ' label_app_kubernetes_io_component="decode-build"', "1x20"),
         series("kube_pod_status_ready", 'namespace="llm", pod="chat-decode-1", condition="true"', "1x20"),
         series("kube_pod_labels", 'namespace="llm", pod="chat-decode-1", label_app_kubernetes_io_name="atom-engine",'
                ' label_app_kubernetes_io_component="decode"', "1x20")],
    ),
    "AtomOperatorReconcileErrors": (
        "30m", {"namespace": "atom-system", "pod": "atom-operator-0", "severity": "warning"},
        [series("atom_operator_reconciles_total", 'namespace="atom-system", pod="atom-operator-0", result="error"',
                "0+1x40")],
        [series("atom_operator_reconciles_total", 'namespace="atom-system", pod="atom-operator-0", result="error"',
                "0x40")],  # the series exists at 0 from the start (atom_operator.telemetry)
    ),
    "AtomOperatorNotLeading": (
        "10m", {"namespace": "atom-system", "severity": "critical"},
        [series("atom_operator_leader", OPERATOR.format(0), "1x3 0x20"), series("atom_operator_leader",
                                                                             OPERATOR.format(1), "0x25")],
        # The Lease changed hands: the other replica leads a minute later.
        [series("atom_operator_leader", OPERATOR.format(0), "1x3 0x20"), series("atom_operator_leader",
                                                                             OPERATOR.format(1), "0x4 1x20")],
    ),
    "AtomAutoscalerScalingLimited": (
        "30m", {"namespace": "llm", "atomdeployment": "chat", "reason": "NPUBudget", "severity": "warning"},
        limited("NPUBudget", "True"),
        # At its floor (idle), and a limit that was lifted.
        limited("AtMinReplicas", "True") + limited("DesiredWithinRange", "False"),
    ),
    "AtomAutoscalerMetricsMissing": (
        "15m", {"namespace": "llm", "atomdeployment": "chat", "severity": "warning"},
        condition("ScalingActive", "False", "1x20"),
        condition("ScalingActive", "False", "1x2 0x18"),  # one missed reading, then metrics again
    ),
    "AtomAutoscalerDrainTimedOut": (
        "10m", {"namespace": "llm", "atomdeployment": "chat", "role": "decode", "severity": "warning"},
        [series("atom_autoscaler_drain_timeouts_total", f'{DEPLOYMENT_SERIES}, role="decode"', "0x5 1x10")],
        # The series exists at 0 from a role's first autoscaling step (atom_operator.autoscale.telemetry).
        [series("atom_autoscaler_drain_timeouts_total", f'{DEPLOYMENT_SERIES}, role="decode"', "0x15")],
    ),
}


@pytest.fixture(scope="module")
def rule() -> dict:
    (r,) = of_kind(render(ON), "PrometheusRule")
    return r


@pytest.fixture(scope="module")
def rules_file(rule: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool is missing: run make prereqs (Debian's prometheus package)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def alerts(rule: dict) -> dict[str, dict]:
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}


def summary(template: str, labels: dict[str, str]) -> str:
    """The annotation as Prometheus expands it: each ``{{ $labels.x }}`` replaced by the alert's label."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)


def test_off_by_default() -> None:
    assert not of_kind(render({}), "PrometheusRule")


def test_the_rule_is_valid_against_prometheus_operators_crd(rule: dict) -> None:
    validate(rule)


def test_promtool_accepts_the_rules(rules_file: Path) -> None:
    out = promtool("check", "rules", str(rules_file))
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_slo_thresholds_are_bucket_bounds_the_engine_serves() -> None:
    """A threshold between two bounds would match no bucket: the SLO ratio would never be computed."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["prometheusRule"]
    assert values["ttftSeconds"] in buckets.TIME_TO_FIRST_TOKEN
    assert values["itlSeconds"] in buckets.INTER_TOKEN_LATENCY


def test_every_alert_has_a_case(rule: dict) -> None:
    assert set(alerts(rule)) == set(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_each_alert_fires_on_its_series_and_not_on_the_others(name: str, rule: dict, rules_file: Path,
                                                              tmp_path: Path) -> None:
    at, labels, firing, quiet = CASES[name]
    annotations = {k: summary(v, labels) for k, v in alerts(rule)[name]["annotations"].items()}
    tests = [
        {"interval": "1m", "input_series": firing,
         "alert_rule_test": [{"eval_time": at, "alertname": name,
                              "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]}]},
        {"interval": "1m", "input_series": quiet,
         "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": []}]},
    ]
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [str(rules_file)], "evaluation_interval": "1m",
                                         "tests": tests}))
    out = promtool("test", "rules", str(test_file))
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_wrong_expectation_fails(rule: dict, rules_file: Path, tmp_path: Path) -> None:
    """promtool really checks: the quiet series of an alert do not make it fire."""
    at, labels, _, quiet = CASES["AtomKVCacheSaturated"]
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": quiet, "alert_rule_test": [
            {"eval_time": at, "alertname": "AtomKVCacheSaturated", "exp_alerts": [{"exp_labels": labels}]}]}]}))
    assert promtool("test", "rules", str(test_file)).returncode != 0


def test_the_operators_error_series_exists_from_the_start() -> None:
    """What AtomOperatorReconcileErrors' quiet case assumes: a series born at 1 would show no rate, so the first
    error would never alert."""
    from atom_operator import telemetry
    from prometheus_client import generate_latest

    text = generate_latest(telemetry.REGISTRY).decode()
    assert re.search(r'^atom_operator_reconciles_total\{result="error"\} ', text, re.M)
