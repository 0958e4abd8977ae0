"""The operator tests' fixtures: the shared operator, spare NPU nodes, and small helpers to wait on the cluster."""

from __future__ import annotations

from typing import Any

import pytest
from atom_localcluster.cluster import FakeNode, atom_node, rngd_node

from tests.operator.process import OperatorProcess

# Spare capacity for this directory, so pods of namespaces still being torn down never starve a test.
NODES = [atom_node(f"atom-op-{i}", 4) for i in range(3)] + [rngd_node("rngd-op-0", 2)]
# An RNGD node whose device plugin partitions each card into 2-core units (a cluster profile test points at it).
PARTITIONED = rngd_node("rngd-part-0", 1, "furiosa.ai/rngd-2core.12gb", product="rngd-max")  # 4 partitions
# A node only the over-demand test selects: exactly 4 NPUs, so it knows how many pods fit.
SMALL_POOL = "serving.atom.dev/test-pool"
SMALL = FakeNode("atom-small-0", {**atom_node("x").labels, SMALL_POOL: "small"}, atom_node("x").npus)


@pytest.fixture(scope="session")
def op(cluster, operator_process) -> OperatorProcess:
    cluster.add_nodes([*NODES, SMALL, PARTITIONED])
    return operator_process


def atomdeployment(name: str, namespace: str, **spec: Any) -> dict:
    return {
        "apiVersion": "serving.atom.dev/v1alpha1",
        "kind": "AtomDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": {"source": "builtin:tiny"}, **spec},
    }
