"""The chart's scrape objects (monitoring.podMonitor, monitoring.serviceMonitor): off by default; accepted by
prometheus-operator's real CRD schemas (v0.85.0, tests/observability/crds.py); the PodMonitor selects the engine
pods the operator makes and nothing else it makes, on their metrics port; the ServiceMonitor reaches the
operator's /metrics through a Service that selects the operator's pods on the port it serves."""

from __future__ import annotations

import pytest
from atom_operator.api import AtomDeploymentSpec
from atom_operator.children import Defaults, Owner, build_children
from atom_operator.children.compile import build_job

from tests.observability.crds import of_kind, render, validate

ON = {"monitoring": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True},
                     "labels": {"release": "kube-prometheus-stack"}}}
PD = {"model": {"source": "builtin:tiny"}, "decode": {"replicas": 1, "localPrefill": False},
      "prefill": {"replicas": 1}}


def matches(selector: dict, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and In/NotIn/Exists expressions) against a pod's labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return render(ON)


def test_off_by_default() -> None:
    kinds = {d["kind"] for d in render({})}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    assert [d["metadata"]["name"] for d in of_kind(render({}), "Service")] == ["t-atom-operator-webhook"]


def test_scrape_objects_are_valid_against_prometheus_operators_crds(rendered: list[dict]) -> None:
    monitors = of_kind(rendered, "PodMonitor") + of_kind(rendered, "ServiceMonitor")
    assert len(monitors) == 2
    for m in monitors:
        validate(m)
        assert m["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # what a Prometheus selects by


def test_a_misspelled_field_is_caught() -> None:
    """The check can fail: a field the CRD does not know, or a wrong type."""
    (pm,) = of_kind(render(ON), "PodMonitor")
    pm["spec"]["podMetricsEndpoints"][0]["honourLabels"] = True
    with pytest.raises(AssertionError, match="honourLabels"):
        validate(pm)
    (pm,) = of_kind(render(ON), "PodMonitor")
    pm["spec"]["podMetricsEndpoints"][0]["honorLabels"] = "yes"
    with pytest.raises(Exception, match="is not of type 'boolean'"):
        validate(pm)


def test_the_pod_monitor_selects_the_engine_pods_on_their_metrics_port(rendered: list[dict]) -> None:
    (pm,) = of_kind(rendered, "PodMonitor")
    endpoint = pm["spec"]["podMetricsEndpoints"][0]
    assert endpoint["honorLabels"] is True  # the engine's model_name and engine labels win
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    owner = Owner("llm", "ns", "uid-1", AtomDeploymentSpec.model_validate(PD, strict=False))
    children = build_children(owner, Defaults()).desired
    pods = {c["metadata"]["name"]: c["spec"]["template"] for c in children if c["kind"] == "Deployment"}
    engines = {n: p for n, p in pods.items() if n in ("llm-decode", "llm-prefill")}
    assert len(engines) == 2
    for name, pod in pods.items():
        selected = matches(pm["spec"]["selector"], pod["metadata"]["labels"])
        assert selected == (name in engines), name
    for pod in engines.values():
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert endpoint["port"] in ports
    # A compile Job's pod (the same labels, component <role>-build) is not scraped.
    job = build_job(owner, "decode", engines["llm-decode"], "key")
    assert not matches(pm["spec"]["selector"], job["spec"]["template"]["metadata"]["labels"])
    # The deployment's name and role become target labels.
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert targets == {"atomdeployment", "role"}


def test_the_service_monitor_reaches_the_operators_metrics_port(rendered: list[dict]) -> None:
    (sm,) = of_kind(rendered, "ServiceMonitor")
    (svc,) = [s for s in of_kind(rendered, "Service") if s["metadata"]["name"].endswith("-metrics")]
    (operator,) = of_kind(rendered, "Deployment")
    assert matches(sm["spec"]["selector"], svc["metadata"]["labels"])
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [svc["metadata"]["namespace"]]}
    pod = operator["spec"]["template"]
    assert matches({"matchLabels": svc["spec"]["selector"]}, pod["metadata"]["labels"])
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    (port,) = svc["spec"]["ports"]
    assert sm["spec"]["endpoints"][0]["port"] == port["name"] and port["targetPort"] == "metrics"
    # atom_deployment_* keep their own namespace label (the AtomDeployment's), not exported_namespace.
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert ports["metrics"] == int(env["ATOM_METRICS_PORT"]) == port["port"]
    # The webhook Service is not selected (it serves no /metrics).
    (webhook,) = [s for s in of_kind(rendered, "Service") if s["metadata"]["name"].endswith("-webhook")]
    assert not matches(sm["spec"]["selector"], webhook["metadata"]["labels"])
