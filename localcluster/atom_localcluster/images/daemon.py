"""The Docker daemon and client: when no daemon answers, ``dockerd`` is started in the background with its own log
file (Debian's ``docker.io`` is installed first when ``dockerd`` is missing). It is left running afterwards, like
the system service it stands in for, so later runs reuse it and its layer cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


class DockerError(RuntimeError):
    """Docker is missing, did not start, or a build failed; the message says which and carries the log tail."""


def cache_dir() -> Path:
    return Path(os.environ.get("ATOM_CACHE_DIR", Path.home() / ".cache" / "atom"))


def log(msg: str) -> None:
    print(f"docker: {msg}", file=sys.stderr, flush=True)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def docker(*args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run the docker client, capturing its output; a failure raises DockerError with the client's stderr."""
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise DockerError(f"docker {' '.join(args[:3])} ... exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc


def daemon_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return docker("version", "--format", "{{.Server.Version}}", check=False, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def apt_install(*packages: str) -> None:
    if os.geteuid() != 0:
        raise DockerError(f"{', '.join(packages)} missing and not root: install them (apt-get install {packages})")
    log(f"installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise DockerError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")


def _dockerd_running() -> bool:
    """Whether the dockerd named by its pid file is alive (starting up or shutting down: not ours to start)."""
    try:
        pid = int(Path("/var/run/docker.pid").read_text().strip())
        return Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd"
    except (OSError, ValueError):
        return False


def ensure_daemon(timeout: float = 120.0) -> None:
    """Make sure a Docker daemon answers: start ``dockerd`` (installing docker.io if needed) when none does."""
    if daemon_answers():
        return
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        apt_install("docker.io")
    logfile = cache_dir() / "docker" / "dockerd.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    proc: subprocess.Popen[bytes] | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon_answers():
            if proc is not None:
                log(f"dockerd is up (pid {proc.pid})")
            return
        if proc is None and not _dockerd_running():
            log(f"no daemon answers; starting dockerd (log: {logfile})")
            with open(logfile, "ab") as out:
                # A new session: the daemon outlives this process (and a test run), as the system service would.
                proc = subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        elif proc is not None and proc.poll() is not None:
            raise DockerError(f"dockerd exited {proc.returncode} before answering; {logfile}:\n{tail(logfile)}")
        time.sleep(0.5)
    raise DockerError(f"no Docker daemon answered within {timeout:.0f}s; {logfile}:\n{tail(logfile)}")


def image_exists(ref: str) -> bool:
    return docker("image", "inspect", "--format", "{{.Id}}", ref, check=False).returncode == 0


def image_size(ref: str) -> int:
    return int(docker("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())
