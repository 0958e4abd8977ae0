"""What each image installs: its lock (``requirements/<target>.lock``, derived from the lock its tests run with by
``make docker-lock``, hack/image_locks.py), and reading a lock's pins."""

from __future__ import annotations

import tomllib
from pathlib import Path

from atom_localcluster.tools import REPO

REQUIREMENTS = REPO / "requirements"


def _serve_extra_without_torch() -> tuple[str, ...]:
    """The engine's ``serve`` extra (engine/pyproject.toml) less torch, whose version a vendor stack decides."""
    with open(REPO / "engine" / "pyproject.toml", "rb") as f:
        serve = tomllib.load(f)["project"]["optional-dependencies"]["serve"]
    return tuple(req for req in serve if not req.startswith("torch"))


# Lock subsets: what each image installs. `setuptools` is the build backend of engine/ and operator/, which the
# Dockerfile builds without network (--no-build-isolation), so it is pinned with the rest.
LOCK_SOURCES: dict[str, tuple[str, ...]] = {
    "operator": ("./engine", "./operator", "setuptools"),
    "engine": ("./engine[serve,grammar]", "setuptools"),
    # FuriosaAI's packages bring the torch they pin (2.10), so the engine's serve extra (torch 2.15) is taken
    # without its torch; the Dockerfile installs the engine itself with --no-deps.
    "engine-rngd": ("furiosa-torch", "furiosa-smi", "./engine", *_serve_extra_without_torch(), "setuptools"),
}
# The lock each target's pins come from: the tests run with exactly these (requirements/<name>.lock).
LOCK_CONSTRAINTS = {"operator": "dev", "engine": "dev", "engine-rngd": "rngd"}
# Declared dependencies left out of a lock on purpose, with the reason written into the lock file.
LOCK_EXCLUDES: dict[str, dict[str, str]] = {
    "engine": {
        "triton": "GPU kernel compiler (~1 GB); the image runs torch on the CPU and `import torch` does not need it",
    },
    "engine-rngd": {
        "triton": "GPU kernel compiler (~1 GB); furiosa-torch compiles for the NPU and `import torch` does not need it",
    },
}


def lock_path(target: str) -> Path:
    return REQUIREMENTS / f"{target}.lock"


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return name.lower().replace("_", "-").replace(".", "-")


def read_pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a lock file, keyed by normalized name."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            pins[normalize(name)] = ver.strip()
    return pins
