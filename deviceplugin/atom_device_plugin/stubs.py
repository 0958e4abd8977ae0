"""The kubelet's device-plugin API (v1beta1) as Python gRPC stubs, generated from the pinned k8s.io/kubelet proto.

Nothing generated is committed: the proto comes from the Go module proxy through ``go mod download`` (the module
the pinned kubelet is built with), and ``grpc_tools.protoc`` turns it into ``api_pb2`` / ``api_pb2_grpc`` under
``${ATOM_CACHE_DIR:-~/.cache/atom}/deviceplugin-stubs/<key>/``, where ``key`` hashes the proto and the generator's
version. A fresh machine builds them at first use (seconds); later uses import the cached files.

k8s.io/kubelet v0.34.4's api.proto imports nothing (the gogoproto options of older releases are gone), so it is
compiled exactly as published, with no edits.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

KUBELET_MODULE = "k8s.io/kubelet"
# The k8s.io/kubelet that hack/tools/kubernetes/go.mod pins for the kubelet the tests run (a test checks they agree).
KUBELET_VERSION = "v0.34.4"
PROTO_PATH = "pkg/apis/deviceplugin/v1beta1/api.proto"
PACKAGE = "deviceplugin_v1beta1"  # the generated modules' package inside a cache entry


class StubsError(RuntimeError):
    """The proto could not be fetched or compiled; the message says which step and why."""


@dataclass(frozen=True)
class Api:
    """The generated modules: ``pb`` holds the messages, ``grpc`` the services' stubs and servicer bases."""

    pb: ModuleType
    grpc: ModuleType
    directory: Path


def cache_root() -> Path:
    return Path(os.environ.get("ATOM_CACHE_DIR") or Path.home() / ".cache" / "atom") / "deviceplugin-stubs"


def download_proto(version: str = KUBELET_VERSION) -> Path:
    """``go mod download`` k8s.io/kubelet@version (a no-op when the module cache has it); returns its api.proto."""
    if shutil.which("go") is None:
        raise StubsError(f"fetching {KUBELET_MODULE}@{version} needs Go (https://go.dev/dl); none is on PATH")
    with tempfile.TemporaryDirectory(prefix="atom-gomod-") as cwd:  # outside any go.mod: a plain module fetch
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{KUBELET_MODULE}@{version}"],
            capture_output=True, text=True, cwd=cwd, env={**os.environ, "GOFLAGS": "-mod=mod"},
        )
    try:
        info = json.loads(out.stdout)
    except json.JSONDecodeError:
        info = {}
    if out.returncode != 0 or "Dir" not in info:
        detail = info.get("Error") or out.stderr.strip() or out.stdout.strip()
        raise StubsError(f"go mod download {KUBELET_MODULE}@{version} failed: {detail}")
    proto = Path(info["Dir"]) / PROTO_PATH
    if not proto.is_file():
        raise StubsError(f"{KUBELET_MODULE}@{version} has no {PROTO_PATH}")
    return proto


def _generator_version() -> str:
    from importlib.metadata import version

    return version("grpcio-tools")


def generate(proto: Path, root: Path | None = None) -> Path:
    """Compile ``proto`` into a cache entry keyed by its content and the generator; returns the entry."""
    text = proto.read_bytes()
    key = hashlib.sha256(text + b"\0" + _generator_version().encode()).hexdigest()[:16]
    root = root or cache_root()
    entry = root / key
    if (entry / ".complete").exists():
        return entry
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    try:
        pkg = tmp / PACKAGE
        pkg.mkdir()
        (pkg / "api.proto").write_bytes(text)
        (pkg / "__init__.py").write_text(f"# Generated from {proto.name} by grpc_tools.protoc: do not edit.\n")
        out = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"--python_out={tmp}",
             f"--grpc_python_out={tmp}", str(pkg / "api.proto")],
            capture_output=True, text=True,
        )
        if out.returncode != 0:
            raise StubsError(f"grpc_tools.protoc failed on {proto}: {out.stderr.strip()}")
        (tmp / ".complete").write_text(f"{proto}\n")
        try:
            tmp.rename(entry)
        except OSError:  # another process made the same entry first: theirs is identical
            if not (entry / ".complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def load(entry: Path) -> Api:
    """Import the generated package from a cache entry (its gRPC module imports the messages by package name)."""
    init = entry / PACKAGE / "__init__.py"
    loaded = sys.modules.get(PACKAGE)
    if loaded is None or Path(loaded.__file__ or "") != init:
        spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(init.parent)])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = module
        spec.loader.exec_module(module)
        for sub in ("api_pb2", "api_pb2_grpc"):
            sys.modules.pop(f"{PACKAGE}.{sub}", None)
    pb = importlib.import_module(f"{PACKAGE}.api_pb2")
    grpc_mod = importlib.import_module(f"{PACKAGE}.api_pb2_grpc")
    return Api(pb, grpc_mod, entry)


@functools.cache
def api(version: str = KUBELET_VERSION) -> Api:
    """The stubs for k8s.io/kubelet@version, fetched and generated first when the cache lacks them."""
    return load(generate(download_proto(version)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate (once) the device-plugin API stubs; print their directory")
    parser.add_argument("--kubelet-version", default=KUBELET_VERSION, help="the k8s.io/kubelet module version")
    args = parser.parse_args(argv)
    try:
        print(api(args.kubelet_version).directory)
    except StubsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
