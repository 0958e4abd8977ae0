"""Chaos on the real control plane: an API-server outage with a deletion meanwhile, hand edits of the fields the
operator owns, restarts. Each scenario prints its time to repair (``pytest -s``: lines ``time_to_repair ...``)."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable

import pytest
from atom_localcluster.wait import wait_for
from atom_operator.children.meta import DEPLOYMENT_LABEL

from tests.operator.conftest import atomdeployment
from tests.operator.process import OperatorProcess
from tests.operator.test_reconciler import PD, children, condition, create, get, ready

pytestmark = pytest.mark.cluster
SELECTOR = {"app.kubernetes.io/component": "decode", "app.kubernetes.io/instance": "llm",
            "app.kubernetes.io/name": "atom-engine"}  # fmt: skip


def repaired(scenario: str, since: float, done: Callable[[], object], what: str) -> float:
    """Wait until ``done()`` holds; print and return the seconds since ``since`` (the moment of the damage)."""
    wait_for(done, what, timeout=120)
    seconds = time.monotonic() - since
    print(f"time_to_repair scenario={scenario} seconds={seconds:.2f}")
    return seconds


def uid(cluster, namespace: str, kind: str, name: str) -> str | None:
    return children(cluster, namespace).get((kind, name), {}).get("metadata", {}).get("uid")


# ---- an API-server outage ------------------------------------------------------------------------------------
def test_a_child_deleted_while_the_operators_api_server_is_down_is_recreated(cluster, op, namespace, tmp_path) -> None:
    """The operator's API server (one of two, as in an HA control plane) is killed for 30 s; meanwhile a child
    is deleted through the other. No watch ever reports that deletion: the listing after the reconnect does."""
    op.stop()  # the session's operator would see the deletion live; this one must not
    server = cluster.start_apiserver("kube-apiserver-b")
    port = int(server.rsplit(":", 1)[1])
    other = OperatorProcess(cluster, tmp_path, server=server)
    try:
        other.start(ATOM_NAMESPACES=namespace, ATOM_RESYNC_SECONDS="600")
        create(cluster, namespace)
        wait_for(lambda: ready(cluster, namespace), "Ready")
        before = {k: uid(cluster, namespace, *k) for k in (("Service", "llm"), ("ConfigMap", "llm-decode-config"))}
        since = other.log_offset()
        cluster.stop_component("kube-apiserver-b")
        outage = time.monotonic()
        other.wait_log(r"event=watch_broken", since=since, timeout=30)
        cluster.kubectl("delete", "service", "llm", "-n", namespace)
        cluster.kubectl("delete", "configmap", "llm-decode-config", "-n", namespace)
        deleted = time.monotonic()
        time.sleep(max(0.0, 30 - (time.monotonic() - outage)))
        cluster.start_apiserver("kube-apiserver-b", port=port)
        back = time.monotonic()

        def recreated() -> bool:
            return all(uid(cluster, namespace, *k) not in (None, old) for k, old in before.items())

        repaired("apiserver_outage_30s_from_restart", back, recreated, "both children recreated")
        print(f"time_to_repair scenario=apiserver_outage_30s_from_deletion seconds={time.monotonic() - deleted:.2f}")
        other.wait_log(r"event=tombstones kind=(Service|ConfigMap)", since=since, timeout=5)
        obj = wait_for(lambda: ready(cluster, namespace), "Ready again")
        assert condition(obj, "Degraded")["status"] == "False"
    finally:
        other.stop()
        cluster.stop_component("kube-apiserver-b")
        op.start()


def relists(op: OperatorProcess, kind: str) -> float:
    found = re.search(rf'^atom_operator_relists_total{{kind="{kind}"}} (\S+)$', op.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


def test_a_periodic_resync_lists_every_child_again_and_writes_nothing(cluster, op, namespace, tmp_path) -> None:
    op.stop()  # one operator for this namespace: this one, resyncing every 3 s
    other = OperatorProcess(cluster, tmp_path)
    try:
        other.start(ATOM_NAMESPACES=namespace, ATOM_RESYNC_SECONDS="3")
        create(cluster, namespace, **PD)
        wait_for(lambda: ready(cluster, namespace), "Ready")
        settled = wait_for(lambda: (n := len(other.writes(namespace))) and _still(other, namespace, n), "settled")
        before = {k: relists(other, k) for k in ("AtomDeployment", "Deployment", "Service", "ConfigMap", "Pod")}
        wait_for(lambda: all(relists(other, k) >= n + 3 for k, n in before.items()), "three resyncs of each kind")
        assert _still(other, namespace, settled), other.writes(namespace)[settled:]
    finally:
        other.stop()
        op.start()


# ---- hand edits of what is ours ------------------------------------------------------------------------------
def test_a_selector_key_added_by_hand_is_removed_and_traffic_returns(cluster, op, namespace) -> None:
    create(cluster, namespace)
    wait_for(lambda: ready(cluster, namespace), "Ready")
    patch = {"spec": {"selector": {"team": "x"}}, "metadata": {"annotations": {"other.example/note": "kept"}}}
    cluster.kubectl("patch", "service", "llm", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    edited = time.monotonic()

    def exact() -> bool:
        return cluster.get("service", "llm", "-n", namespace)["spec"]["selector"] == SELECTOR

    repaired("service_selector_key_added", edited, exact, "the Service's selector exactly ours")
    service = cluster.get("service", "llm", "-n", namespace)
    assert service["metadata"]["annotations"]["other.example/note"] == "kept"  # others' additions elsewhere stay

    def serving() -> bool:
        slices = cluster.get("endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name=llm")["items"]
        return any(e.get("conditions", {}).get("ready") for s in slices for e in s.get("endpoints") or [])

    wait_for(serving, "a ready endpoint behind the Service")


def test_hand_edits_of_our_labels_env_data_and_owner_reference_are_undone_and_others_additions_stay(
    cluster, op, namespace
) -> None:
    create(cluster, namespace)
    wait_for(lambda: ready(cluster, namespace), "Ready")
    owner_uid = get(cluster, namespace)["metadata"]["uid"]

    def obj(kind: str, name: str) -> dict:
        return cluster.get(kind, name, "-n", namespace)

    def engine_env() -> list[str]:
        containers = obj("deployment", "llm-decode")["spec"]["template"]["spec"]["containers"]
        return [e["name"] for e in next(c for c in containers if c["name"] == "engine").get("env") or []]

    # Our label removed (the watches match children by owner reference, so the edit is still seen); another added.
    for kind, name in (("deployment", "llm-decode"), ("service", "llm"), ("configmap", "llm-decode-config")):
        cluster.kubectl("label", kind, name, "-n", namespace, f"{DEPLOYMENT_LABEL}-", "team=search")
        edited = time.monotonic()
        repaired(
            f"label_removed_{kind}",
            edited,
            lambda k=kind, n=name: obj(k, n)["metadata"]["labels"].get(DEPLOYMENT_LABEL) == "llm",
            f"our label back on the {kind}",
        )
        assert obj(kind, name)["metadata"]["labels"]["team"] == "search"

    ours = engine_env()
    cluster.kubectl("set", "env", "deployment/llm-decode", "-n", namespace, "-c", "engine", "DEBUG=1")
    edited = time.monotonic()
    repaired("engine_env_var_added", edited, lambda: engine_env() == ours, "the engine's env exactly ours")

    patch = {"data": {"extra.yaml": "lanes: 99\n"}}
    cluster.kubectl("patch", "configmap", "llm-decode-config", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    edited = time.monotonic()
    repaired(
        "configmap_key_added",
        edited,
        lambda: set(obj("configmap", "llm-decode-config")["data"]) == {"engine.yaml"},
        "the ConfigMap's data exactly ours",
    )

    unowned = [{"op": "remove", "path": "/metadata/ownerReferences"}]
    cluster.kubectl("patch", "service", "llm", "-n", namespace, "--type=json", "-p", json.dumps(unowned))
    edited = time.monotonic()
    repaired(
        "owner_reference_removed",
        edited,
        lambda: [r["uid"] for r in obj("service", "llm")["metadata"].get("ownerReferences") or []] == [owner_uid],
        "the Service controlled by its AtomDeployment again",
    )
    wait_for(lambda: ready(cluster, namespace), "Ready after the repairs")


# ---- restarts ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_converged_restart_writes_nothing_and_ready_never_flips(cluster, op: OperatorProcess, namespace, sig) -> None:
    create(cluster, namespace, **PD)
    wait_for(lambda: ready(cluster, namespace), "Ready")
    settled = wait_for(lambda: (n := len(op.writes(namespace))) and _still(op, namespace, n), "writes settled")
    conditions = get(cluster, namespace)["status"]["conditions"]
    since = op.log_offset()
    op.stop(sig)
    op.start()  # returns once ready: every informer has listed
    # The start-up listing reconciles it (children and status) and finds nothing to do.
    op.wait_log(rf"reconciled namespace={namespace} name=llm writes=0", since=since)
    _still(op, namespace, settled)  # and the reconciles the pod and Deployment listings queued behind it
    writes = op.writes(namespace)[settled:]
    print(f"restart_writes signal={sig.name} writes={len(writes)}")
    assert writes == [], [f"{w['verb']} {w['objectRef']}" for w in writes]
    # No status write means Ready never flipped; the conditions, transition times included, are as they were.
    assert get(cluster, namespace)["status"]["conditions"] == conditions
    assert not re.search(rf"namespace={namespace} name=llm writes=[1-9]", op.log()[since:])


def _still(op: OperatorProcess, namespace: str, n: int) -> int | None:
    time.sleep(2)
    return n if len(op.writes(namespace)) == n else None


# ---- zero decode replicas ------------------------------------------------------------------------------------
def test_zero_decode_replicas_is_not_ready_and_advertises_no_endpoint(cluster, op, namespace) -> None:
    cluster.apply(atomdeployment("llm", namespace, decode={"replicas": 0}))

    def scaled_to_zero():
        obj = get(cluster, namespace)
        return obj if condition(obj, "Ready").get("reason") == "ScaledToZero" else None

    obj = wait_for(scaled_to_zero, "Ready=False ScaledToZero")
    assert condition(obj, "Ready")["status"] == "False"
    assert "endpoint" not in obj["status"]
    cluster.kubectl("scale", "atomdeployment/llm", "-n", namespace, "--replicas=1")
    obj = wait_for(lambda: ready(cluster, namespace), "Ready at 1")
    assert obj["status"]["endpoint"] == f"http://llm.{namespace}.svc:8000/v1"
