"""The image builds: ``docker build --target <target>`` of the top-level Dockerfile, the Python images with the
locked wheels served from the host, the Go tools' images from the pinned binary alone."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from atom_localcluster import tools
from atom_localcluster.images.base import choose_base
from atom_localcluster.images.daemon import DockerError, cache_dir, ensure_daemon, log, tail
from atom_localcluster.images.wheels import serve_wheels, wheelhouse
from atom_localcluster.tools import REPO

DOCKERFILE = REPO / "Dockerfile"
TARGETS = ("operator", "engine", "engine-rngd")  # the Python images, each installing requirements/<target>.lock
# The project package each image installs: its version tags the image, its CLI is the entrypoint.
PACKAGE = {"operator": "operator", "engine": "engine", "engine-rngd": "engine"}
# Images of a pinned Go tool built on the host (atom_localcluster/tools.py), not of Python wheels: target -> the
# binary, staged into the build context at build/<target>/<binary>.
GO_TARGETS = {"epp": "epp"}
IMAGES = (*TARGETS, *GO_TARGETS)


def version(target: str) -> str:
    with open(REPO / PACKAGE[target] / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def default_tag(target: str) -> str:
    if target in GO_TARGETS:  # the upstream release it packages
        return f"atom-{target}:{tools.toolset_of(GO_TARGETS[target]).version}"
    return f"atom-{target}:{version(target)}"


def stage_text(target: str) -> str:
    """The Dockerfile's global ARGs and the ``target`` stage alone. BuildKit builds only the stages a target needs;
    the legacy builder (Docker without buildx, as on this machine) builds every stage before it in the file, so a
    Go image is built from its own stage only, not after the operator's and the engine's for nothing."""
    lines = DOCKERFILE.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    start = next(i for i, line in enumerate(lines) if line.startswith("FROM ") and line.endswith(f" AS {target}"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("FROM ")), len(lines))
    return "\n".join([line for line in lines[:first] if line.startswith("ARG ")] + lines[start:end]) + "\n"


@contextlib.contextmanager
def go_context(target: str) -> Iterator[Path]:
    """A build context holding only the target's pinned binary (built first if missing), where the stage's COPY
    looks for it: build/<target>/<binary>."""
    binary = GO_TARGETS[target]
    with tempfile.TemporaryDirectory(prefix=f"atom-{target}-context-") as tmp:
        staged = Path(tmp) / "build" / target / binary
        staged.parent.mkdir(parents=True)
        shutil.copy2(tools.path(binary), staged)
        yield Path(tmp)


@dataclass
class BuildResult:
    target: str
    tag: str
    base: str
    seconds: float
    log: Path = field(repr=False)


def build(target: str, tag: str | None = None, base: str | None = None, build_args: Sequence[str] = ()) -> BuildResult:
    """``docker build --target <target>`` of the top-level Dockerfile, with the locked wheels served from the host."""
    if target not in IMAGES:
        raise ValueError(f"target must be one of {IMAGES}, got {target!r}")
    ensure_daemon()
    base = choose_base(base if base is not None else os.environ.get("BASE_IMAGE"))
    tag = tag or default_tag(target)
    logfile = cache_dir() / "docker" / f"build-{target}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    dockerfile, context = str(DOCKERFILE), str(REPO)
    with contextlib.ExitStack() as stack:
        if target in GO_TARGETS:
            dockerfile, context = "-", str(stack.enter_context(go_context(target)))
            where = []
        else:
            url = stack.enter_context(serve_wheels(wheelhouse(target)))
            # host network: the RUN steps reach the wheel server on the host's loopback
            where = ["--network", "host", "--build-arg", f"WHEELS_URL={url}"]
        cmd = ["docker", "build", "--file", dockerfile, "--target", target, "--tag", tag, *where,
               "--build-arg", f"BASE_IMAGE={base}", *[a for arg in build_args for a in ("--build-arg", arg)], context]
        log(f"building {tag} (--target {target}, BASE_IMAGE={base}; log: {logfile})")
        with open(logfile, "wb") as out:
            stdin = stage_text(target).encode() if dockerfile == "-" else None
            rc = subprocess.run(cmd, input=stdin, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise DockerError(f"docker build --target {target} exited {rc}; {logfile}:\n{tail(logfile, 40)}")
    result = BuildResult(target, tag, base, time.monotonic() - started, logfile)
    log(f"built {tag} in {result.seconds:.1f}s")
    return result
