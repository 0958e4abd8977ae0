"""The cluster NPU profile on the harness: kwok nodes labelled and advertising NPUs exactly as the vendors' feature
discovery and device plugins do, under both ATOM naming schemes (see atom_localcluster/cluster.py)."""

from __future__ import annotations

import pytest
from atom_localcluster.wait import wait_for
from atom_operator.children import Defaults
from atom_operator.npu import NpuProfile

from tests.operator.conftest import PARTITIONED
from tests.operator.process import OperatorProcess
from tests.operator.test_reconciler import create, pods, ready

pytestmark = pytest.mark.cluster
IO_URING = {"type": "Localhost", "localhostProfile": "atom/rngd-io-uring.json"}


def npus(limits: dict[str, str]) -> dict[str, str]:
    """The extended resources of a container's limits (beside them, the operator's sized memory default)."""
    return {r: q for r, q in limits.items() if r not in ("cpu", "memory")}


def placed(cluster, namespace: str, component: str) -> list[tuple[dict, dict]]:
    """(pod, its node) of every pod of the role."""
    return [(p, cluster.get("node", p["spec"]["nodeName"])) for p in pods(cluster, namespace, component)]


def test_a_default_cluster_gets_generic_named_npus_on_the_nodes_that_advertise_them(cluster, op, namespace) -> None:
    create(cluster, namespace, decode={"replicas": 2, "npusPerReplica": 2})
    wait_for(lambda: ready(cluster, namespace), "Ready")
    for pod, node in placed(cluster, namespace, "decode"):
        assert npus(pod["spec"]["containers"][0]["resources"]["limits"]) == {"rebellions.ai/npu": "2"}
        assert node["status"]["allocatable"]["rebellions.ai/npu"] == "4"
        assert node["metadata"]["labels"]["rebellions.ai/npu.present"] == "true"


def test_rngd_prefill_pods_land_on_rngd_nodes_only_with_the_vendors_resource_and_the_io_uring_profile(
    cluster, op, namespace
) -> None:
    # Restricted Pod Security enforced: a pod that broke it would never be created, and Ready would never come.
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    create(
        cluster,
        namespace,
        decode={"replicas": 2, "npusPerReplica": 1, "localPrefill": False},
        prefill={"replicas": 2, "backend": "rngd", "npusPerReplica": 1},
    )
    wait_for(lambda: ready(cluster, namespace), "Ready")
    for pod, node in placed(cluster, namespace, "prefill"):
        spec, labels = pod["spec"], node["metadata"]["labels"]
        assert labels["furiosa.ai/npu.family"] == "rngd" and labels["furiosa.ai/npu.product"] == "rngd"
        assert not any(k.startswith("rebellions.ai/") for k in labels), "an RNGD pod on an ATOM node"
        assert npus(spec["containers"][0]["resources"]["limits"]) == {"furiosa.ai/rngd": "1"}
        assert spec["nodeSelector"] == {"furiosa.ai/npu.family": "rngd"}
        assert spec["securityContext"]["seccompProfile"] == IO_URING
        assert spec["containers"][0]["securityContext"]["seccompProfile"] == IO_URING
        assert spec["containers"][0]["image"] == Defaults().rngd_image
    for pod, node in placed(cluster, namespace, "decode"):
        spec, labels = pod["spec"], node["metadata"]["labels"]
        assert labels["rebellions.ai/npu.present"] == "true"
        assert not any(k.startswith("furiosa.ai/") for k in labels), "an ATOM pod on an RNGD node"
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["containers"][0]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_a_legacy_cluster_profile_puts_the_pods_on_the_rebellions_ai_atom_and_partitioned_rngd_nodes(
    cluster, op: OperatorProcess, namespace
) -> None:
    # A cluster whose RBLN device plugin runs with useGenericResourceName off advertises rebellions.ai/ATOM only,
    # and whose Furiosa plugin partitions cards into 2-core units: with the operator told so, the pods land on
    # exactly those nodes (the harness has one of each).
    profile = NpuProfile(
        atom={"resource": "rebellions.ai/ATOM"},
        rngd={"resource": "furiosa.ai/rngd-2core.12gb", "nodeSelector": {"furiosa.ai/npu.product": "rngd-max"}},
    )
    op.restart(ATOM_NPU_PROFILE=profile.dump())
    try:
        create(
            cluster,
            namespace,
            decode={"replicas": 2, "npusPerReplica": 2},
            # One partition a pod: two could be parts of two cards, which one furiosa device cannot fuse.
            prefill={"replicas": 2, "backend": "rngd", "npusPerReplica": 1},
        )
        wait_for(lambda: ready(cluster, namespace), "Ready on the legacy-named and partitioned nodes")
        for pod, node in placed(cluster, namespace, "decode"):
            assert npus(pod["spec"]["containers"][0]["resources"]["limits"]) == {"rebellions.ai/ATOM": "2"}
            assert node["status"]["allocatable"]["rebellions.ai/ATOM"] == "4"
            assert "rebellions.ai/npu" not in node["status"]["allocatable"]
        for pod, node in placed(cluster, namespace, "prefill"):
            assert npus(pod["spec"]["containers"][0]["resources"]["limits"]) == {"furiosa.ai/rngd-2core.12gb": "1"}
            assert node["metadata"]["name"] == PARTITIONED.name
    finally:
        op.restart()
