"""spec.routing.inferencePool on the real control plane: a missing CRD is a condition, the CRD's arrival makes the
pool and its picker on its own, turning routing off removes them, and the Service keeps serving throughout."""

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
    # Nothing the operator watches changes with the CRD: its re-check of a CRDNotInstalled condition (every
    # routing.TTL) finds it, with no edit of the AtomDeployment to prompt it.
    generation = get(cluster, namespace)["metadata"]["generation"]
    made = wait_for(lambda: condition(get(cluster, namespace), "InferencePool").get("status") == "True"
                    and condition(get(cluster, namespace), "InferencePool"),
                    "the pool once the CRD is there", timeout=2 * routing.TTL + 60, interval=1)
    assert made["reason"] == "PoolCreated"
    assert get(cluster, namespace)["metadata"]["generation"] == generation
    pool = cluster.get("inferencepool", "llm", "-n", namespace)
    assert pool["spec"]["endpointPickerRef"]["name"] == "llm-epp"
    assert pool["metadata"]["ownerReferences"][0]["kind"] == "AtomDeployment"
    for kind in PICKER_KINDS:
        assert cluster.get(kind, "llm-epp", "-n", namespace)["metadata"]["ownerReferences"][0]["name"] == "llm"


def test_turning_routing_off_removes_the_pool_and_its_picker_and_keeps_the_service(
    cluster, operator_process, namespace  # noqa: ANN001
) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(gie.pool_crd()))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{gie.POOL_CRD_NAME}", "--timeout=60s")
    cluster.apply(atomdeployment("llm", namespace, decode={"replicas": 1, "npusPerReplica": 1},
                                 routing={"inferencePool": {"enabled": True}}))
    wait_for(lambda: condition(get(cluster, namespace), "InferencePool").get("status") == "True",
             "the pool", timeout=2 * routing.TTL + 60, interval=1)
    wait_for(lambda: exists(cluster, namespace, "deployment", "llm-epp"), "the picker")

    cluster.kubectl("patch", "atomdeployment", "llm", "-n", namespace, "--type=merge",
                    "-p", '{"spec": {"routing": {"inferencePool": {"enabled": false}}}}')

    def left() -> list[str]:
        children = [("inferencepool", "llm"), *((kind, "llm-epp") for kind in PICKER_KINDS)]
        return [kind for kind, name in children if exists(cluster, namespace, kind, name)]

    wait_for(lambda: not left(), "the routing children to go", timeout=60)
    assert not condition(get(cluster, namespace), "InferencePool")
    assert exists(cluster, namespace, "service", "llm") and exists(cluster, namespace, "deployment", "llm-decode")


PICKER_KINDS = ("deployment", "service", "serviceaccount", "role", "rolebinding")


def exists(cluster, namespace: str, kind: str, name: str) -> bool:  # noqa: ANN001
    return cluster.kubectl("get", kind, name, "-n", namespace, check=False).returncode == 0
