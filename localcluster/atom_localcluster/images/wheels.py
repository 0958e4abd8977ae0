"""The wheelhouse: containers cannot verify TLS to the package index here, so the wheels of
``requirements/<target>.lock`` are downloaded on the host (``pip download``, exact pins, binary only) into
``${ATOM_CACHE_DIR:-~/.cache/atom}/wheels/<hash of the lock>`` and served to the build over loopback HTTP
(``--network host``, ``--build-arg WHEELS_URL``). Without that argument the Dockerfile installs from the default
index, which is what a plain ``docker build`` does where the index is reachable."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from atom_localcluster.images.daemon import DockerError, cache_dir, log
from atom_localcluster.images.locks import lock_path, read_pins
from atom_localcluster.tools import REPO

# The wheel server listens here when the port is free. The URL is a build argument and so part of the layer
# cache key: a stable URL keeps warm rebuilds cached (another port still builds correctly, only uncached).
WHEELS_PORT = 38411
# The images' Python: wheels are fetched for it, whatever interpreter runs this module.
IMAGE_PYTHON = "3.11"


def _platform_tags() -> list[str]:
    # bookworm's glibc is 2.36, so every manylinux tag up to 2.36 fits; pip does not widen a --platform itself.
    arch = platform.machine()
    return [f"manylinux_2_{minor}_{arch}" for minor in range(36, 16, -1)] + [f"manylinux2014_{arch}"]


def wheelhouse(target: str) -> Path:
    """A folder with one wheel per line of ``requirements/<target>.lock``, downloaded once per lock content."""
    lock = lock_path(target)
    # Keyed by the pins alone: a comment in the lock file changes nothing that is downloaded.
    pins = "".join(f"{name}=={version}\n" for name, version in read_pins(lock).items())
    key = hashlib.sha256(f"{pins}{IMAGE_PYTHON} {_platform_tags()}".encode()).hexdigest()[:16]
    dest = cache_dir() / "wheels" / f"{target}-{key}"
    if (dest / ".complete").exists():
        return dest
    partial = dest.with_name(dest.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)  # kept on failure: pip skips the wheels it already has
    log(f"downloading the wheels of {lock.relative_to(REPO)} into {dest}")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", IMAGE_PYTHON, "--implementation", "cp",
           *[a for tag in _platform_tags() for a in ("--platform", tag)], "--dest", str(partial), "-r", str(lock)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DockerError(f"pip download for {lock.name} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    (partial / ".complete").write_text(lock.read_text())
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return dest


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class names it so
        pass


@contextlib.contextmanager
def serve_wheels(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on loopback for the length of a build; yields the URL to pass as WHEELS_URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEELS_PORT), handler)
    except OSError:  # the usual port is taken (another build): any port works, the deps layer just rebuilds
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="wheels", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
