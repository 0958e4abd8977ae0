"""The endpoint picker's image (Dockerfile target ``epp``, what the operator's ``<name>-epp`` Deployment runs):
built here from the base the other images use, carrying exactly the pinned picker, as the Deployment runs it."""

from __future__ import annotations

import hashlib
import json

import pytest
from atom_localcluster import tools
from atom_localcluster.images import builds, daemon
from atom_operator.children import Defaults

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def epp_image() -> builds.BuildResult:
    daemon.ensure_daemon()
    return builds.build("epp")


def run(image: str, *args: str, entrypoint: str | None = None) -> str:
    ep = ["--entrypoint", entrypoint] if entrypoint else []
    return daemon.docker("run", "--rm", "--network", "none", *ep, image, *args, timeout=300).stdout


def test_it_carries_the_pinned_picker_byte_for_byte(epp_image: builds.BuildResult) -> None:
    host = hashlib.sha256(tools.path("epp").read_bytes()).hexdigest()
    assert run(epp_image.tag, "/usr/local/bin/epp", entrypoint="sha256sum").split()[0] == host


def test_it_runs_the_picker_as_the_deployments_non_root_user(epp_image: builds.BuildResult) -> None:
    config = json.loads(daemon.docker("image", "inspect", "--format", "{{json .Config}}", epp_image.tag).stdout)
    assert config["Entrypoint"] == ["/usr/local/bin/epp"] and config["User"] == "65532:65532"
    assert run(epp_image.tag, "-u", entrypoint="id").strip() == "65532"


def test_its_tag_is_the_release_the_operator_deploys_by_default(epp_image: builds.BuildResult) -> None:
    release = tools.toolset_of("epp").version
    assert epp_image.tag == f"atom-epp:{release}"
    assert Defaults().epp_image.rsplit(":", 1)[1] == release
