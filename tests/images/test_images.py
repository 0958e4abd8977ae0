"""The two images of the top-level Dockerfile, built for real and run.

The operator image runs its CLI and carries no torch; the engine image imports torch and runs atom_engine on
the built-in tiny model, token for token as the host does; both run as a non-root user with the product's CLI
as entrypoint and install exactly their lock. The lock subsets are checked against requirements/dev.lock
without Docker.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from atom_localcluster import docker
from atom_localcluster.docker import BuildResult

# Cold builds download ~3 GB of wheels and debootstrap a base image: longer than the suite's per-test limit.
docker_test = [pytest.mark.docker, pytest.mark.timeout(3600)]

# Not counted as the image's dependencies: the venv's installer and the project's own packages.
OWN = {"pip", "atom-engine", "atom-operator"}
# Never in the operator image: torch and everything that exists only to serve it.
TORCH_STACK = ("torch", "triton", "nvidia-", "cuda-", "safetensors", "tokenizers", "numpy")

GENERATE = """
import json, torch
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings
out = LLMEngine(EngineSettings()).generate(["hello, image"], SamplingParams(max_tokens=12))[0]
print(json.dumps({"torch": torch.__version__.split("+")[0], "tokens": out.token_ids}))
"""


def run(image: str, *args: str, entrypoint: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``docker run --rm`` with no network: the images must work offline."""
    ep = ["--entrypoint", entrypoint] if entrypoint else []
    return docker.docker("run", "--rm", "--network", "none", *ep, image, *args, check=check, timeout=600)


def installed(image: str) -> dict[str, str]:
    out = run(image, "-m", "pip", "list", "--format", "json", entrypoint="python").stdout
    return {docker.normalize(p["name"]): p["version"] for p in json.loads(out)}


def image_config(image: str) -> dict:
    return json.loads(docker.docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)


# --- operator ---------------------------------------------------------------------------------------------------


class TestOperatorImage:
    pytestmark = docker_test

    def test_prints_its_version(self, operator_image: BuildResult) -> None:
        out = run(operator_image.tag, "--version").stdout
        assert out.strip() == f"atom-operator {docker.version('operator')}"

    def test_has_no_torch(self, operator_image: BuildResult) -> None:
        packages = installed(operator_image.tag)
        assert "atom-operator" in packages  # the listing is the image's venv, not an empty one
        assert [p for p in packages if p.startswith(TORCH_STACK)] == []
        proc = run(operator_image.tag, "-c", "import torch", entrypoint="python", check=False)
        assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr

    def test_loads_the_operator_without_torch(self, operator_image: BuildResult) -> None:
        code = "import sys, atom_operator.main, atom_engine.settings; print('torch' in sys.modules)"
        assert run(operator_image.tag, "-c", code, entrypoint="python").stdout.strip() == "False"

    def test_installs_exactly_its_lock(self, operator_image: BuildResult) -> None:
        packages = {n: v for n, v in installed(operator_image.tag).items() if n not in OWN}
        assert packages == docker.read_pins(docker.lock_path("operator"))

    def test_dependencies_are_complete(self, operator_image: BuildResult) -> None:
        # The lock is installed with --no-deps, so pip check is what proves it is the whole closure.
        proc = run(operator_image.tag, "-m", "pip", "check", entrypoint="python", check=False)
        assert proc.returncode == 0, proc.stdout


# --- engine -----------------------------------------------------------------------------------------------------


class TestEngineImage:
    pytestmark = docker_test

    def test_generates_on_torch_as_the_host_does(self, engine_image: BuildResult) -> None:
        in_image = json.loads(run(engine_image.tag, "-c", GENERATE, entrypoint="python").stdout)
        assert in_image["torch"] == docker.read_pins(docker.lock_path("engine"))["torch"]
        # The same program on the host (the test venv's torch): greedy outputs are token-exact.
        host = subprocess.run([sys.executable, "-c", GENERATE],
                              capture_output=True, text=True, check=True)
        assert in_image["tokens"] == json.loads(host.stdout)["tokens"]
        assert len(in_image["tokens"]) == 12

    def test_installs_exactly_its_lock(self, engine_image: BuildResult) -> None:
        packages = {n: v for n, v in installed(engine_image.tag).items() if n not in OWN}
        assert packages == docker.read_pins(docker.lock_path("engine"))

    def test_dependencies_are_complete_but_what_the_lock_leaves_out(self, engine_image: BuildResult) -> None:
        proc = run(engine_image.tag, "-m", "pip", "check", entrypoint="python", check=False)
        problems = proc.stdout.splitlines()
        missing = {m.group(1) for line in problems if (m := re.search(r"requires (\S+), which is not installed", line))}
        assert missing == set(docker.LOCK_EXCLUDES["engine"]) and len(problems) == len(missing), proc.stdout


# --- both -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", docker.TARGETS)
@pytest.mark.docker
@pytest.mark.timeout(3600)
def test_runs_as_non_root_with_its_cli(target: str, request: pytest.FixtureRequest) -> None:
    image: BuildResult = request.getfixturevalue(f"{target}_image")
    config = image_config(image.tag)
    assert config["Entrypoint"] == [f"atom-{target}"]
    assert config["User"] == "10001:10001"
    assert run(image.tag, "-u", entrypoint="id").stdout.strip() == "10001"
    assert run(image.tag, "-c", "import shutil; print(shutil.which('atom-" + target + "'))",
               entrypoint="python").stdout.strip() == f"/opt/atom/bin/atom-{target}"


# --- locks (no Docker) ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", docker.TARGETS)
def test_lock_pins_are_the_dev_lock_pins(target: str) -> None:
    dev = docker.read_pins(docker.REQUIREMENTS / "dev.lock")
    pins = docker.read_pins(docker.lock_path(target))
    assert {n: v for n, v in pins.items() if dev.get(n) != v} == {}, "run: python -m atom_localcluster.docker lock"


def test_only_the_engine_lock_carries_torch() -> None:
    assert "torch" in docker.read_pins(docker.lock_path("engine"))
    assert [p for p in docker.read_pins(docker.lock_path("operator")) if p.startswith(TORCH_STACK)] == []

