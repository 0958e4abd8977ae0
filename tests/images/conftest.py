"""Session fixtures for tests that need Docker: a daemon that answers and the three images, built once
per run.

Other suites (real node, kind) can reuse them with ``from tests.images.conftest import engine_image`` or by
calling :func:`atom_localcluster.builds.build` themselves.
"""

from __future__ import annotations

import pytest
from atom_localcluster.images import builds, daemon


@pytest.fixture(scope="session")
def docker_daemon() -> None:
    """A Docker daemon that answers: the one running, or dockerd started in the background."""
    daemon.ensure_daemon()


@pytest.fixture(scope="session")
def operator_image(docker_daemon: None) -> builds.BuildResult:
    """``docker build --target operator``: a real build, cached layers reused when nothing changed."""
    return builds.build("operator")


@pytest.fixture(scope="session")
def engine_image(docker_daemon: None) -> builds.BuildResult:
    """``docker build --target engine`` (torch; the first build on a machine downloads ~3 GB of wheels)."""
    return builds.build("engine")


@pytest.fixture(scope="session")
def engine_rngd_image(docker_daemon: None) -> builds.BuildResult:
    """``docker build --target engine-rngd`` (furiosa-torch, torch 2.10 and the cross compiler it shells out to)."""
    return builds.build("engine-rngd")
