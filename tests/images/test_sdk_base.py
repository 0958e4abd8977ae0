"""The engine image on an SDK base (``ENGINE_BASE_IMAGE``): a stand-in for an RBLN SDK image, whose Python carries
``rebel`` and its own torch pin (optimum-rbln 0.12.0 pins torch==2.13.0+cpu), keeps both; the image installs only
the locked packages the base lacks, and none of torch's CUDA stack."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from atom_localcluster.images import base, builds, daemon, locks

from tests.images.test_images import OWN, docker_test, installed, run

pytestmark = docker_test

SDK_TORCH = "2.13.0+cpu"
SDK_VERSION = "0.0.0+standin"
STANDIN_TAG = "atom-sdk-standin:test"
IMAGE_TAG = "atom-engine-sdkbase:test"


def _dist(site: Path, name: str, module: str, version: str) -> None:
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(f'__version__ = "{version}"\n')
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("")


@pytest.fixture(scope="module")
def sdk_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Both images are kept (stable tags), so a warm run rebuilds nothing."""
    daemon.ensure_daemon()
    base_image = base.choose_base(os.environ.get("BASE_IMAGE"))
    ctx = tmp_path_factory.mktemp("sdk-standin")
    _dist(ctx / "site", "torch", "torch", SDK_TORCH)
    _dist(ctx / "site", "rebel-compiler", "rebel", SDK_VERSION)
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY site/ /tmp/site/\n"
        "RUN python3 -c \"import shutil, site; shutil.copytree('/tmp/site', site.getsitepackages()[0],"
        " dirs_exist_ok=True)\" && rm -rf /tmp/site\n")
    daemon.docker("build", "--tag", STANDIN_TAG, str(ctx), timeout=600)
    return builds.build("engine", tag=IMAGE_TAG, build_args=[f"ENGINE_BASE_IMAGE={STANDIN_TAG}"]).tag


def test_the_image_imports_the_bases_torch_and_sdk(sdk_image: str) -> None:
    probe = "import json, rebel, torch; print(json.dumps([torch.__version__, torch.__file__, rebel.__version__]))"
    version, path, sdk = json.loads(run(sdk_image, "-c", probe, entrypoint="python").stdout)
    assert version == SDK_TORCH and not path.startswith("/opt/atom") and sdk == SDK_VERSION


def test_the_image_installs_only_what_the_base_lacks(sdk_image: str) -> None:
    have = installed(sdk_image)
    assert have["torch"] == SDK_TORCH
    assert not [n for n in have if n.startswith(("nvidia-", "cuda-", "triton"))]
    lock = {locks.normalize(n): v for n, _, v in (line.partition("==") for line in
            locks.lock_path("engine").read_text().splitlines() if line and not line.startswith("#"))}
    rest = {n: v for n, v in lock.items() if n != "torch" and not n.startswith(("nvidia-", "cuda-"))}
    assert {n: have.get(n) for n in rest} == rest  # everything else at its locked version
    assert set(have) - set(lock) - OWN <= {"rebel-compiler"}
    assert run(sdk_image, "--help").returncode == 0  # the entrypoint runs on the base's Python
