"""Each AtomDeployment's status as metrics (atom_operator.deployment_metrics): the mapping from a status the
reconciler computes to its series, and the series on the operator's real /metrics endpoint as the controller
stores statuses, gone with the deployment, without an API server; and once on the local control plane, from the
session's operator process."""

from __future__ import annotations

import re

import aiohttp
import pytest
from atom_localcluster.cluster import free_port
from atom_localcluster.wait import wait_for
from atom_operator import telemetry
from atom_operator.api import KIND
from atom_operator.children import Defaults
from atom_operator.children.meta import APPLIED_HASH
from atom_operator.controller import Controller
from atom_operator.deployment_metrics import Published, series
from atom_operator.status import Condition, Observation, RoleState, compute

from tests.operator.test_logic import as_stored, deployment, owner
from tests.operator.test_reconciler import create, ready


def computed(ready: int, *scaling: Condition) -> dict:
    """The status the reconciler computes for a decode role of 2 replicas, ``ready`` of them Ready."""
    desired = deployment()
    dep = as_stored(desired)
    dep["status"] = {"observedGeneration": 1, "replicas": 2, "readyReplicas": ready, "updatedReplicas": 2}
    seen = Observation(1, (RoleState("decode", 2, dep, desired["metadata"]["annotations"][APPLIED_HASH]),),
                       scaling=scaling)  # fmt: skip
    return compute(owner(decode={"replicas": 2}), seen, None, "T1")


def test_a_computed_status_maps_to_its_condition_and_replica_series() -> None:
    limited = Condition("ScalingLimited", True, "AtMaxReplicas", "decode needs 5, maxReplicas is 2")
    out = series(computed(1, limited))
    conditions = out["atom_deployment_condition"]
    # Each type has a series per status, 1 for its own.
    assert {k: v for k, v in conditions.items() if k[0] == "Ready"} == {
        ("Ready", "True"): 0.0, ("Ready", "False"): 1.0, ("Ready", "Unknown"): 0.0}  # fmt: skip
    assert conditions["ScalingLimited", "True"] == 1.0 and conditions["ScalingLimited", "False"] == 0.0
    assert {t for t, _ in conditions} == {"Ready", "Progressing", "Degraded", "ScalingLimited"}
    reasons = out["atom_deployment_condition_reason"]
    assert reasons == {("Ready", "ReplicasNotReady"): 1.0, ("Progressing", "RollingOut"): 1.0,
                       ("Degraded", "AsExpected"): 1.0, ("ScalingLimited", "AtMaxReplicas"): 1.0}  # fmt: skip
    # The prefill role is not run: status reports it at 0 of 0.
    assert out["atom_deployment_replicas"] == {("decode", "ready"): 1.0, ("decode", "desired"): 2.0,
                                               ("prefill", "ready"): 0.0, ("prefill", "desired"): 0.0}  # fmt: skip


def test_a_status_not_written_yet_has_no_series() -> None:
    assert series(None) == {"atom_deployment_condition": {}, "atom_deployment_condition_reason": {},
                            "atom_deployment_replicas": {}}  # fmt: skip
    # A role without a summary yet (an older operator's status): its ready pods, no desired count made up.
    assert series({"decode": {"readyReplicas": 1}})["atom_deployment_replicas"] == {("decode", "ready"): 1.0}


def scraped(text: str, key: tuple[str, str]) -> dict[str, float]:
    """The atom_deployment_* samples of one AtomDeployment in /metrics text, by their whole line's name{labels}."""
    mine = f'atomdeployment="{key[1]}",namespace="{key[0]}"'
    return {m[1]: float(m[2]) for m in re.finditer(r"^(atom_deployment_\w+\{[^}]*\}) (\S+)$", text, re.M)
            if mine in m[1]}  # fmt: skip


def test_a_changed_reason_replaces_its_series_and_forget_removes_them_all() -> None:
    from prometheus_client import generate_latest

    key, published = ("t-reason", "llm"), Published()
    published.publish(key, computed(1))
    before = scraped(generate_latest(telemetry.REGISTRY).decode(), key)
    assert before['atom_deployment_condition_reason{atomdeployment="llm",namespace="t-reason",reason="RollingOut",'
                  'type="Progressing"}'] == 1.0
    published.publish(key, computed(2))  # rolled out
    after = scraped(generate_latest(telemetry.REGISTRY).decode(), key)
    assert not any('reason="RollingOut"' in name for name in after)
    assert after['atom_deployment_condition_reason{atomdeployment="llm",namespace="t-reason",'
                 'reason="RolloutComplete",type="Progressing"}'] == 1.0
    published.forget(key)
    assert scraped(generate_latest(telemetry.REGISTRY).decode(), key) == {}


async def get_metrics(port: int) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200
        return await r.text()


async def test_the_operators_metrics_endpoint_serves_each_stored_status_until_the_deployment_is_deleted() -> None:
    key = ("t-endpoint", "llm")
    body = {"apiVersion": "serving.atom.dev/v1alpha1", "kind": KIND,
            "metadata": {"name": key[1], "namespace": key[0], "uid": "u", "resourceVersion": "5", "generation": 1},
            "spec": {"model": {"source": "builtin:tiny"}, "decode": {"replicas": 2}},
            "status": computed(1)}  # fmt: skip
    c = Controller(kube=None, defaults=Defaults(), workers=0)  # type: ignore[arg-type] - no reconcile runs
    port = free_port()
    runner = await telemetry.serve("127.0.0.1", port, lambda: True, lambda: True)
    try:
        c.event(KIND, "ADDED", body, key)
        up = scraped(await get_metrics(port), key)
        ready = 'atom_deployment_replicas{atomdeployment="llm",namespace="t-endpoint",role="decode",state="ready"}'
        assert up[ready] == 1.0
        assert up['atom_deployment_condition{atomdeployment="llm",namespace="t-endpoint",status="False",'
                  'type="Ready"}'] == 1.0
        # A newer status (the reconciler's own write, through the same event): the series follow it.
        c.event(KIND, "MODIFIED", {**body, "metadata": {**body["metadata"], "resourceVersion": "6"},
                                   "status": computed(2)}, key)  # fmt: skip
        now = scraped(await get_metrics(port), key)
        assert now[ready] == 2.0
        assert now['atom_deployment_condition{atomdeployment="llm",namespace="t-endpoint",status="True",'
                   'type="Ready"}'] == 1.0
        c.event(KIND, "DELETED", body, key)
        assert scraped(await get_metrics(port), key) == {}
    finally:
        await runner.cleanup()


def test_an_autoscaled_roles_drain_timeouts_start_at_0_and_its_series_go_with_it() -> None:
    """A timeout counter born at 1 would show no increase (AtomAutoscalerDrainTimedOut would never fire), and a
    deployment no longer autoscaled keeps no series."""
    from atom_operator.autoscale import telemetry as scaling

    key = ("t-autoscaled", "llm")
    sample = telemetry.REGISTRY.get_sample_value
    labels = {"namespace": key[0], "atomdeployment": key[1], "role": "decode"}
    scaling.watch(key, ["decode"])
    scaling.DESIRED.labels(*key, "decode").set(3)
    assert sample("atom_autoscaler_drain_timeouts_total", labels) == 0
    assert sample("atom_autoscaler_desired_replicas", labels) == 3
    scaling.forget(key)
    assert sample("atom_autoscaler_drain_timeouts_total", labels) is None
    assert sample("atom_autoscaler_desired_replicas", labels) is None


@pytest.mark.cluster
def test_the_operator_process_serves_a_deployments_status_until_it_is_deleted(cluster, op, namespace) -> None:
    key = (namespace, "llm")
    create(cluster, namespace)
    wait_for(lambda: ready(cluster, namespace), "Ready")
    labels = f'atomdeployment="llm",namespace="{namespace}"'
    want = {f'atom_deployment_condition{{{labels},status="True",type="Ready"}}': 1.0,
            f'atom_deployment_replicas{{{labels},role="decode",state="desired"}}': 1.0,
            f'atom_deployment_replicas{{{labels},role="decode",state="ready"}}': 1.0}  # fmt: skip
    # The status write's echo may reach the store a moment after kubectl shows it.
    wait_for(lambda: want.items() <= scraped(op.metrics(), key).items(), "the Ready status on /metrics")
    # The harness runs one replica without a Lease: it leads.
    assert re.search(r"^atom_operator_leader 1\.0$", op.metrics(), re.M)
    cluster.kubectl("delete", "atomdeployment", "llm", "-n", namespace)
    wait_for(lambda: scraped(op.metrics(), key) == {}, "no series left of the deleted AtomDeployment")
