"""Session fixtures: one real control plane for the whole run, a fresh namespace per test."""

from __future__ import annotations

import importlib.util
import signal
import uuid
from collections.abc import Iterator

import pytest
from atom_localcluster.cluster import Cluster
from atom_localcluster.existing import ExistingCluster, wanted

# tests/rngd run in .venv-rngd (furiosa-torch pins torch 2.10): `make test` runs them there, in a second pytest.
collect_ignore = [] if importlib.util.find_spec("furiosa") else ["rngd"]


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_sessionstart(session: pytest.Session) -> None:
    # A CI runner or `timeout` stops the run with SIGTERM: turn it into pytest's interrupt, so fixtures tear
    # the clusters down (processes, mounts, temp dirs) as they do on Ctrl-C, instead of dying mid-test.
    signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """etcd, kube-apiserver, controller-manager, scheduler and kwok NPU nodes, torn down after the session."""
    c: Cluster = ExistingCluster() if wanted() else Cluster()
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"t-{request.node.name[:30].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:5]}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-")
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def operator_process(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The one operator of the session (reconciler and webhook server), with the CRD installed; restartable.

    Shared by every test directory: two operators reconciling the same objects would fight.
    """
    from atom_operator.api.crd import render

    from tests.operator.process import OperatorProcess

    cluster.kubectl("apply", "-f", "-", input=render())
    cluster.wait_crd_established("atomdeployments.serving.atom.dev")
    op = OperatorProcess(cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    try:
        yield op
    finally:
        op.stop()
