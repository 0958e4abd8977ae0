"""Docker for the image tests and ``make docker-build``: a daemon, a base image, a wheelhouse, and the builds.

Nothing here assumes a registry can be reached from inside a container or that an image can be pulled:

* **Daemon.** When no daemon answers, ``dockerd`` is started in the background with its own log file (Debian's
  ``docker.io`` is installed first when ``dockerd`` is missing). It is left running afterwards, like the system
  service it stands in for, so later runs reuse it and its layer cache.
* **Base image.** ``BASE_IMAGE`` when set; else the Dockerfile's public default when it is present or can be
  pulled; else a minimal Debian with python3 made by ``debootstrap`` and ``docker import``-ed as
  ``atom-base:<hash of its recipe>``, built once and reused while the recipe is unchanged.
* **Python packages.** Containers cannot verify TLS to the package index here, so the wheels of
  ``requirements/<target>.lock`` are downloaded on the host (``pip download``, exact pins, binary only) into
  ``${ATOM_CACHE_DIR:-~/.cache/atom}/wheels/<hash of the lock>`` and served to the build over loopback HTTP
  (``--network host``, ``--build-arg WHEELS_URL``). Without that argument the Dockerfile installs from the
  default index, which is what a plain ``docker build`` does where the index is reachable.

Command line (also what the Makefile calls)::

    python -m atom_localcluster.docker daemon            # make sure a daemon answers
    python -m atom_localcluster.docker base              # build or reuse the local base image, print its tag
    python -m atom_localcluster.docker build operator engine epp
    python -m atom_localcluster.docker build engine-rngd # the rngd prefill image (furiosa-torch, torch 2.10)
    python -m atom_localcluster.docker lock              # regenerate requirements/{operator,engine,engine-rngd}.lock
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from atom_localcluster import tools
from atom_localcluster.tools import REPO

DOCKERFILE = REPO / "Dockerfile"
REQUIREMENTS = REPO / "requirements"
TARGETS = ("operator", "engine", "engine-rngd")  # the Python images, each installing requirements/<target>.lock
# The project package each image installs: its version tags the image, its CLI is the entrypoint.
PACKAGE = {"operator": "operator", "engine": "engine", "engine-rngd": "engine"}
# Images of a pinned Go tool built on the host (atom_localcluster/tools.py), not of Python wheels: target -> the
# binary, staged into the build context at build/<target>/<binary>.
GO_TARGETS = {"epp": "epp"}
IMAGES = (*TARGETS, *GO_TARGETS)
# The Dockerfile's default BASE_IMAGE; used by the tooling only when it is already present or can be pulled.
PUBLIC_BASE = "python:3.11-slim"
# The wheel server listens here when the port is free. The URL is a build argument and so part of the layer
# cache key: a stable URL keeps warm rebuilds cached (another port still builds correctly, only uncached).
WHEELS_PORT = 38411
# The images' Python: wheels are fetched for it, whatever interpreter runs this module.
IMAGE_PYTHON = "3.11"


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


class DockerError(RuntimeError):
    """Docker is missing, did not start, or a build failed; the message says which and carries the log tail."""


def cache_dir() -> Path:
    return Path(os.environ.get("ATOM_CACHE_DIR", Path.home() / ".cache" / "atom"))


def _log(msg: str) -> None:
    print(f"docker: {msg}", file=sys.stderr, flush=True)


def _tail(path: Path, lines: int = 30) -> str:
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


# --- the daemon -----------------------------------------------------------------------------------------------


def daemon_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return docker("version", "--format", "{{.Server.Version}}", check=False, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _apt_install(*packages: str) -> None:
    if os.geteuid() != 0:
        raise DockerError(f"{', '.join(packages)} missing and not root: install them (apt-get install {packages})")
    _log(f"installing {' '.join(packages)} with apt-get")
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
        _apt_install("docker.io")
    log = cache_dir() / "docker" / "dockerd.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc: subprocess.Popen[bytes] | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon_answers():
            if proc is not None:
                _log(f"dockerd is up (pid {proc.pid})")
            return
        if proc is None and not _dockerd_running():
            _log(f"no daemon answers; starting dockerd (log: {log})")
            with open(log, "ab") as out:
                # A new session: the daemon outlives this process (and a test run), as the system service would.
                proc = subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        elif proc is not None and proc.poll() is not None:
            raise DockerError(f"dockerd exited {proc.returncode} before answering; {log}:\n{_tail(log)}")
        time.sleep(0.5)
    raise DockerError(f"no Docker daemon answered within {timeout:.0f}s; {log}:\n{_tail(log)}")


def image_exists(ref: str) -> bool:
    return docker("image", "inspect", "--format", "{{.Id}}", ref, check=False).returncode == 0


# --- the local base image -------------------------------------------------------------------------------------


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
        _apt_install("debootstrap")
    work = cache_dir() / "docker"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="atom-base-", dir=work) as tmp:
        rootfs = Path(tmp) / "rootfs"
        log = work / "debootstrap.log"
        _log(f"building {tag} with debootstrap {recipe.suite} (log: {log})")
        cmd = ["debootstrap", f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}",
               recipe.suite, str(rootfs)]
        with open(log, "wb") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise DockerError(f"debootstrap exited {rc}; {log}:\n{_tail(log)}")
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
    _log(f"built {tag} in {time.monotonic() - started:.0f}s")
    return tag


def choose_base(explicit: str | None = None) -> str:
    """BASE_IMAGE when given; the public default when present or pullable; else the local debootstrap base."""
    if explicit:
        return explicit
    if image_exists(PUBLIC_BASE) or docker("pull", PUBLIC_BASE, check=False, timeout=120).returncode == 0:
        return PUBLIC_BASE
    return base_image()


# --- the wheelhouse -------------------------------------------------------------------------------------------


def lock_path(target: str) -> Path:
    return REQUIREMENTS / f"{target}.lock"


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
    _log(f"downloading the wheels of {lock.relative_to(REPO)} into {dest}")
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


# --- builds ---------------------------------------------------------------------------------------------------


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
    log = cache_dir() / "docker" / f"build-{target}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
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
        _log(f"building {tag} (--target {target}, BASE_IMAGE={base}; log: {log})")
        with open(log, "wb") as out:
            stdin = stage_text(target).encode() if dockerfile == "-" else None
            rc = subprocess.run(cmd, input=stdin, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise DockerError(f"docker build --target {target} exited {rc}; {log}:\n{_tail(log, 40)}")
    result = BuildResult(target, tag, base, time.monotonic() - started, log)
    _log(f"built {tag} in {result.seconds:.1f}s")
    return result


def image_size(ref: str) -> int:
    return int(docker("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())


# --- lock subsets ---------------------------------------------------------------------------------------------


def resolve_lock(target: str, python: str = sys.executable) -> str:
    """The text of ``requirements/<target>.lock``: the closure of the target's packages, pinned by the lock the
    tests of that target run with (dev.lock; rngd.lock for engine-rngd).

    pip resolves (``install --dry-run --ignore-installed --report``, nothing is installed) with that lock as
    constraints, so every pin equals the one the tests run with; the project's own packages are left out
    (the Dockerfile installs them from the source tree) and so is anything in LOCK_EXCLUDES.
    """
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
               "-c", str(lock_path(LOCK_CONSTRAINTS[target])), *LOCK_SOURCES[target]]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        if proc.returncode != 0:
            raise DockerError(f"resolving {target}.lock failed: {proc.stderr.strip()[-2000:]}")
        installs = json.loads(report.read_text())["install"]
    excludes = LOCK_EXCLUDES.get(target, {})
    pins = sorted(
        (i["metadata"]["name"], i["metadata"]["version"])
        for i in installs
        if not i["download_info"]["url"].startswith("file:") and normalize(i["metadata"]["name"]) not in excludes
    )
    head = [f"# Generated by 'make docker-lock' from {' '.join(LOCK_SOURCES[target])} with",
            f"# requirements/{LOCK_CONSTRAINTS[target]}.lock as constraints: what the image installs"
            " (pip install --no-deps). Do not edit."]
    head += [f"# Left out: {name}: {why}" for name, why in excludes.items()]
    return "\n".join([*head, *(f"{n}=={v}" for n, v in sorted(pins, key=lambda p: p[0].lower())), ""])


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


# --- command line ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atom_localcluster.docker", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("daemon", help="make sure a Docker daemon answers (start dockerd if needed)")
    sub.add_parser("base", help="build or reuse the local debootstrap base image; print its tag")
    b = sub.add_parser("build", help="build image targets of the top-level Dockerfile")
    b.add_argument("targets", nargs="+", choices=IMAGES)
    b.add_argument("--base", help="BASE_IMAGE (default: $BASE_IMAGE, else pullable public, else local base)")
    b.add_argument("--build-arg", action="append", default=[], help="NAME=VALUE passed to docker build")
    sub.add_parser("lock", help="regenerate requirements/{operator,engine,engine-rngd}.lock from dev.lock/rngd.lock")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "daemon":
            ensure_daemon()
        elif args.cmd == "base":
            ensure_daemon()
            print(base_image())
        elif args.cmd == "build":
            for target in args.targets:
                r = build(target, base=args.base, build_args=args.build_arg)
                print(f"{r.tag}\t{image_size(r.tag) / 2**20:.0f} MiB\t{r.seconds:.1f}s")
        elif args.cmd == "lock":
            for target in TARGETS:
                lock_path(target).write_text(resolve_lock(target))
                print(f"wrote {lock_path(target).relative_to(REPO)}")
    except DockerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
