"""spec.routing.inferencePool on the real control plane: a missing CRD is a condition, the CRD's arrival makes the
pool and its picker, and the Service keeps serving throughout."""

from __future__ import annotations

import pytest
from atom_localcluster import gie
from atom_localcluster.wait import wait_for
from atom_operator import routing

from tests.operator.conftest import atomdeployment
from tests.operator.test_reconciler import condition, get

pytestmark = pytest.mark.cluster


def test_a_missing_crd_is_a_condition_and_its_arrival_makes_the_pool_and_its_picker(
    cluster, operator_process, namespace  # noqa: ANN001
) -> None:
    # The session's cluster may have it from another test (tests/routing): start without it.
    cluster.kubectl("delete", "crd", gie.POOL_CRD_NAME, "--ignore-not-found", "--wait=true", timeout=120)
    cluster.apply(atomdeployment("llm", namespace, decode={"replicas": 2, "npusPerReplica": 1},
                                 routing={"inferencePool": {"enabled": True}}))
    missing = wait_for(lambda: condition(get(cluster, namespace), "InferencePool").get("reason") == "CRDNotInstalled"
                       and condition(get(cluster, namespace), "InferencePool"),
                       "the CRDNotInstalled condition", timeout=routing.TTL + 60)
    assert missing["status"] == "False" and "inferencepools.inference.networking.k8s.io" in missing["message"]
    assert cluster.get("service", "llm", "-n", namespace)["spec"]["selector"]  # the plain path stays
    wait_for(lambda: condition(get(cluster, namespace), "Ready").get("status") == "True", "Ready without the pool")

    cluster.kubectl("apply", "--server-side", "-f", str(gie.pool_crd()))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{gie.POOL_CRD_NAME}", "--timeout=60s")
    ports = iter(range(8001, 9000))

    def made_once_asked_again() -> dict | bool:
        # The CRD's arrival changes nothing the operator watches: it looks again when it next applies the children
        # (a spec change, at the latest the resync) once its discovery answer (routing.TTL) has expired.
        cluster.kubectl("patch", "atomdeployment", "llm", "-n", namespace, "--type=merge",
                        "-p", f'{{"spec": {{"service": {{"port": {next(ports)}}}}}}}')
        c = condition(get(cluster, namespace), "InferencePool")
        return c.get("status") == "True" and c

    made = wait_for(made_once_asked_again, "the pool once the CRD is there", timeout=routing.TTL + 90, interval=5)
    assert made["reason"] == "PoolCreated"
    pool = cluster.get("inferencepool", "llm", "-n", namespace)
    assert pool["spec"]["endpointPickerRef"]["name"] == "llm-epp"
    assert pool["metadata"]["ownerReferences"][0]["kind"] == "AtomDeployment"
    for kind in ("deployment", "service", "serviceaccount", "role", "rolebinding"):
        assert cluster.get(kind, "llm-epp", "-n", namespace)["metadata"]["ownerReferences"][0]["name"] == "llm"

