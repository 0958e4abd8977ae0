"""The cluster NPU profile on the harness: kwok nodes labelled and advertising NPUs exactly as the vendors' feature
discovery and device plugins do, under both ATOM naming schemes (see tests/harness/cluster.py)."""

from __future__ import annotations

import pytest
from atom_engine.api import NpuProfile

from tests.harness.wait import wait_for
from tests.operator.process import OperatorProcess
from tests.operator.test_reconciler import create, pods, ready

pytestmark = pytest.mark.cluster


def placed(cluster, namespace: str, component: str) -> list[tuple[dict, dict]]:
    """(pod, its node) of every pod of the role."""
    return [(p, cluster.get("node", p["spec"]["nodeName"])) for p in pods(cluster, namespace, component)]


def test_a_default_cluster_gets_generic_named_npus_on_the_nodes_that_advertise_them(cluster, op, namespace) -> None:
    create(cluster, namespace, decode={"replicas": 2, "npusPerReplica": 2})
    wait_for(lambda: ready(cluster, namespace), "Ready")
    for pod, node in placed(cluster, namespace, "decode"):
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"rebellions.ai/npu": "2"}
        assert node["status"]["allocatable"]["rebellions.ai/npu"] == "4"
        assert node["metadata"]["labels"]["rebellions.ai/npu.present"] == "true"


def test_a_legacy_cluster_profile_puts_the_pods_on_the_rebellions_ai_atom_nodes(
    cluster, op: OperatorProcess, namespace
) -> None:
    # A cluster whose RBLN device plugin runs with useGenericResourceName off advertises rebellions.ai/ATOM only:
    # with the operator told so, the pods land on exactly those nodes (the harness has one, with 4 NPUs).
    op.restart(ATOM_NPU_PROFILE=NpuProfile(atom={"resource": "rebellions.ai/ATOM"}).dump())
    try:
        create(cluster, namespace, decode={"replicas": 2, "npusPerReplica": 2})
        wait_for(lambda: ready(cluster, namespace), "Ready on the legacy-named node")
        for pod, node in placed(cluster, namespace, "decode"):
            assert pod["spec"]["containers"][0]["resources"]["limits"] == {"rebellions.ai/ATOM": "2"}
            assert node["status"]["allocatable"]["rebellions.ai/ATOM"] == "4"
            assert "rebellions.ai/npu" not in node["status"]["allocatable"]
    finally:
        op.restart()
