"""The real-node tier: one control plane with the real node ``localhost`` (containerd, kubelet, kube-proxy).

It is a cluster of its own, not the session's kwok cluster: pods here really run, the chart installs its own
operator (the session's operator process would fight it over every AtomDeployment), and kwok's fake ATOM nodes
would take the engine pods that must run here. kwok still runs, with no fake node to manage.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from atom_localcluster.images import base, daemon
from atom_localcluster.realnode import RealNodeCluster


def pytest_configure(config: pytest.Config) -> None:
    # Also belongs in pytest.ini's markers; registered here too so this directory runs under --strict-markers alone.
    config.addinivalue_line("markers", "realnode: runs pods on a real kubelet + containerd node on this machine")


@pytest.fixture(scope="session")
def real_node() -> Iterator[RealNodeCluster]:
    node = RealNodeCluster(nodes=())
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def cluster(real_node: RealNodeCluster) -> RealNodeCluster:
    """Here ``cluster`` is the real-node cluster, so the shared ``namespace`` fixture makes namespaces on it."""
    return real_node


@pytest.fixture(scope="session")
def base_image(real_node: RealNodeCluster) -> str:
    """The local debootstrap image (python3, a shell), imported into the node's containerd."""
    daemon.ensure_daemon()
    tag = base.base_image()
    real_node.import_image(tag)
    return tag
