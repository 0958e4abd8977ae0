"""The base image: ``BASE_IMAGE`` when set; else the Dockerfile's public default when it is present or can be pulled;
else a minimal Debian with python3 made by ``debootstrap`` and ``docker import``-ed as ``atom-base:<hash of its
recipe>``, built once and reused while the recipe is unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from atom_localcluster.images.daemon import DockerError, apt_install, cache_dir, docker, image_exists, log, tail

# The Dockerfile's default BASE_IMAGE; used by the tooling only when it is already present or can be pulled.
PUBLIC_BASE = "python:3.11-slim"


@dataclass(frozen=True)
class BaseRecipe:
    """A minimal Debian with python3, made by debootstrap; its hash names the image, so a change rebuilds it."""

    suite: str = "bookworm"  # bookworm's python3 is 3.11, the version the locks are resolved for
    variant: str = "minbase"
    # python3-venv: the Dockerfile makes a venv; ca-certificates: so the engine can fetch checkpoints over TLS;
    # libtcmalloc-minimal4: the engine's malloc (engine/atom_engine/malloc.py), which containers here cannot apt-get.
    packages: tuple[str, ...] = ("python3", "python3-venv", "ca-certificates", "libtcmalloc-minimal4")
    # Removed after debootstrap: package caches and lists are not needed to run, only to install.
    prune: tuple[str, ...] = ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*",
                              "var/log/*.log", "var/log/apt/*")
    changes: tuple[str, ...] = ("ENV LANG=C.UTF-8", 'CMD ["python3"]')
    revision: int = 1  # bump when the build steps below change in a way the fields do not show

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def tag(self) -> str:
        return f"atom-base:{self.key()}"


def base_image(recipe: BaseRecipe = BaseRecipe()) -> str:
    """The local base image's tag, built with debootstrap and ``docker import`` unless it exists already."""
    tag = recipe.tag()
    if image_exists(tag):
        return tag
    if os.geteuid() != 0:
        raise DockerError("debootstrap needs root to build the local base image; set BASE_IMAGE instead")
    if shutil.which("debootstrap") is None:
        apt_install("debootstrap")
    work = cache_dir() / "docker"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="atom-base-", dir=work) as tmp:
        rootfs = Path(tmp) / "rootfs"
        logfile = work / "debootstrap.log"
        log(f"building {tag} with debootstrap {recipe.suite} (log: {logfile})")
        cmd = ["debootstrap", f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}",
               recipe.suite, str(rootfs)]
        with open(logfile, "wb") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise DockerError(f"debootstrap exited {rc}; {logfile}:\n{tail(logfile)}")
        for pattern in recipe.prune:
            for p in rootfs.glob(pattern):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        # The kernel fills /proc, /sys and /dev at run time; an image carries them empty.
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "--exclude=./proc/*",
                                "--exclude=./sys/*", "--exclude=./dev/*", "-c", "."], stdout=subprocess.PIPE)
        changes = [a for c in recipe.changes for a in ("--change", c)]
        imp = subprocess.run(["docker", "import", *changes, "-", tag], stdin=tar.stdout, capture_output=True,
                             text=True)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or imp.returncode != 0:
            raise DockerError(f"docker import of {tag} failed: {imp.stderr.strip()[-2000:]}")
    log(f"built {tag} in {time.monotonic() - started:.0f}s")
    return tag


def choose_base(explicit: str | None = None) -> str:
    """BASE_IMAGE when given; the public default when present or pullable; else the local debootstrap base."""
    if explicit:
        return explicit
    if image_exists(PUBLIC_BASE) or docker("pull", PUBLIC_BASE, check=False, timeout=120).returncode == 0:
        return PUBLIC_BASE
    return base_image()
