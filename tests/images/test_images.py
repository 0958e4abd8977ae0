"""The three images of the top-level Dockerfile, built for real and run.

The operator image runs its CLI and carries no torch; the engine image imports torch and runs atom_engine on
the built-in tiny model, token for token as the host does; the engine-rngd image runs an rngd prefill worker from
the artifact the real furiosa-torch compiler built (tests/rngd), equal to the host's rngd venv. All run as a
non-root user with the product's CLI as entrypoint and install exactly their lock. The lock subsets are checked
against the lock their tests run with (dev.lock; rngd.lock for engine-rngd) without Docker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from atom_localcluster.images import builds, daemon, locks
from atom_localcluster.images.builds import BuildResult

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
    return daemon.docker("run", "--rm", "--network", "none", *ep, image, *args, check=check, timeout=600)


def installed(image: str) -> dict[str, str]:
    out = run(image, "-m", "pip", "list", "--format", "json", entrypoint="python").stdout
    return {locks.normalize(p["name"]): p["version"] for p in json.loads(out)}


def image_config(image: str) -> dict:
    return json.loads(daemon.docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)


# --- operator ---------------------------------------------------------------------------------------------------


class TestOperatorImage:
    pytestmark = docker_test

    def test_prints_its_version(self, operator_image: BuildResult) -> None:
        out = run(operator_image.tag, "--version").stdout
        assert out.strip() == f"atom-operator {builds.version('operator')}"

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
        assert packages == locks.read_pins(locks.lock_path("operator"))

    def test_dependencies_are_complete(self, operator_image: BuildResult) -> None:
        # The lock is installed with --no-deps, so pip check is what proves it is the whole closure.
        proc = run(operator_image.tag, "-m", "pip", "check", entrypoint="python", check=False)
        assert proc.returncode == 0, proc.stdout


# --- engine -----------------------------------------------------------------------------------------------------


class TestEngineImage:
    pytestmark = docker_test

    def test_generates_on_torch_as_the_host_does(self, engine_image: BuildResult) -> None:
        in_image = json.loads(run(engine_image.tag, "-c", GENERATE, entrypoint="python").stdout)
        assert in_image["torch"] == locks.read_pins(locks.lock_path("engine"))["torch"]
        # The same program on the host (the test venv's torch): greedy outputs are token-exact.
        host = subprocess.run([sys.executable, "-c", GENERATE],
                              capture_output=True, text=True, check=True)
        assert in_image["tokens"] == json.loads(host.stdout)["tokens"]
        assert len(in_image["tokens"]) == 12



# --- engine-rngd -------------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
RNGD_ARTIFACTS = Path(os.environ.get("ATOM_RNGD_ARTIFACTS", Path.home() / ".cache" / "atom" / "rngd-artifacts"))
# An rngd prefill worker's first chunk, from the artifact in /artifacts (the fake device runtime from /fakes): the
# settings of tests/rngd's float32 artifact, so a warm make test has it already (tests/rngd runs first).
PREFILL = """
import hashlib, json, sys
sys.path.insert(0, "/fakes")
from atom_engine.pd.worker import PrefillWorker
from atom_engine.settings import EngineSettings
w = PrefillWorker(EngineSettings(model_source="builtin:tiny", backend="rngd", lanes=1, kv_blocks=2,
                                 prefix_cache=False, max_seq_len=64, prefill_chunk=16, rngd_pes=1,
                                 compile_cache_dir="/artifacts"))
ship = w.compute("r", list(range(100, 116)), 0)
print(json.dumps({"compiled": hasattr(w.runner.backend, "compile_seconds"),
                  "kv": hashlib.sha256(ship.k.numpy().tobytes() + ship.v.numpy().tobytes()).hexdigest()}))
"""


class TestEngineRngdImage:
    pytestmark = docker_test

    def test_carries_furiosa_torch_its_torch_and_the_cross_compiler(self, engine_rngd_image: BuildResult) -> None:
        code = ("import json, shutil, torch, furiosa.torch; print(json.dumps([torch.__version__.split('+')[0],"
                " shutil.which('aarch64-linux-gnu-gcc')]))")
        torch_version, gcc = json.loads(run(engine_rngd_image.tag, "-c", code, entrypoint="python").stdout)
        assert torch_version == locks.read_pins(locks.lock_path("rngd"))["torch"] == "2.10.0"
        assert gcc == "/usr/bin/aarch64-linux-gnu-gcc"

    def test_runs_the_compiled_prefill_artifact_as_the_rngd_venv_does(self, engine_rngd_image: BuildResult,
                                                                       tmp_path: Path) -> None:
        rngd_python = REPO / ".venv-rngd" / "bin" / "python"
        if not rngd_python.exists():
            pytest.fail("run `make venv-rngd` (make test does)")
        env = {**os.environ, "ATOM_RNGD_RUNTIME": "furiosa_fake", "PYTHONPATH": str(REPO / "tests" / "fakes")}
        # The host's rngd venv: loads the artifact when tests/rngd built it, else compiles it (and caches it).
        host = json.loads(subprocess.run([str(rngd_python), "-c", PREFILL.replace("/artifacts", str(RNGD_ARTIFACTS))],
                                         capture_output=True, text=True, check=True, env=env).stdout)
        proc = daemon.docker("run", "--rm", "--network", "none", "--entrypoint", "python",
                             "-e", "ATOM_RNGD_RUNTIME=furiosa_fake",
                             "-v", f"{RNGD_ARTIFACTS}:/artifacts:ro", "-v", f"{REPO / 'tests' / 'fakes'}:/fakes:ro",
                             engine_rngd_image.tag, "-c", PREFILL, timeout=600)
        in_image = json.loads(proc.stdout.splitlines()[-1])
        assert in_image == {"compiled": False, "kv": host["kv"]}  # the artifact loaded, no compile in the image



# --- both engines -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["engine", "engine-rngd"])
@pytest.mark.docker
@pytest.mark.timeout(3600)
def test_an_engine_image_installs_exactly_its_lock(target: str, request: pytest.FixtureRequest) -> None:
    image: BuildResult = request.getfixturevalue(f"{target.replace('-', '_')}_image")
    packages = {n: v for n, v in installed(image.tag).items() if n not in OWN}
    assert packages == locks.read_pins(locks.lock_path(target))
    # The lock is installed with --no-deps: pip check proves it is the whole closure but what it leaves out.
    proc = run(image.tag, "-m", "pip", "check", entrypoint="python", check=False)
    problems = proc.stdout.splitlines()
    found = [re.search(r"requires (\S+), which is not installed", line) for line in problems]
    # Every problem is a left-out package some package requires (torch and xgrammar both name triton), nothing else.
    assert all(found), proc.stdout
    assert {m.group(1) for m in found if m} == set(locks.LOCK_EXCLUDES[target]), proc.stdout


# --- all --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", builds.TARGETS)
@pytest.mark.docker
@pytest.mark.timeout(3600)
def test_runs_as_non_root_with_its_cli(target: str, request: pytest.FixtureRequest) -> None:
    image: BuildResult = request.getfixturevalue(f"{target.replace('-', '_')}_image")
    cli = f"atom-{builds.PACKAGE[target]}"
    config = image_config(image.tag)
    assert config["Entrypoint"] == [cli]
    assert config["User"] == "10001:10001"
    assert run(image.tag, "-u", entrypoint="id").stdout.strip() == "10001"
    assert run(image.tag, "-c", f"import shutil; print(shutil.which('{cli}'))",
               entrypoint="python").stdout.strip() == f"/opt/atom/bin/{cli}"


# --- locks (no Docker) ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", builds.TARGETS)
def test_lock_pins_are_the_pins_its_tests_run_with(target: str) -> None:
    tested = locks.read_pins(locks.lock_path(locks.LOCK_CONSTRAINTS[target]))
    pins = locks.read_pins(locks.lock_path(target))
    assert {n: v for n, v in pins.items() if tested.get(n) != v} == {}, "run: python -m atom_localcluster.docker lock"


def test_only_the_engine_locks_carry_torch() -> None:
    dev_torch = locks.read_pins(locks.REQUIREMENTS / "dev.lock")["torch"]
    assert locks.read_pins(locks.lock_path("engine"))["torch"] == dev_torch
    assert locks.read_pins(locks.lock_path("engine-rngd"))["torch"] == "2.10.0"  # what furiosa-torch pins
    assert [p for p in locks.read_pins(locks.lock_path("operator")) if p.startswith(TORCH_STACK)] == []

