"""The pinned Kubernetes tools: where their binaries live and how to build them from hack/tools/*/go.mod.

Each tool is an ordinary Go module build at the exact version its go.mod pins. Binaries go to
``${ATOM_TOOLS_DIR:-~/.cache/atom/tools}/<module>-<version>/bin``, so a version bump builds afresh and an
unchanged pin is reused as is (a warm ``make tools`` only checks that the files exist).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GO_MODULES = REPO / "hack" / "tools"


@dataclass(frozen=True)
class ToolSet:
    """One go.mod under hack/tools and the commands it builds."""

    name: str  # folder under hack/tools
    module: str  # the upstream module whose version names the cache folder
    packages: dict[str, str]  # binary name -> Go package path
    version_ldflags: tuple[str, ...] = ()
    on_demand: bool = False  # not built by `make tools`, only when something asks for its path

    @property
    def version(self) -> str:
        text = (GO_MODULES / self.name / "go.mod").read_text()
        m = re.search(rf"^\s*(?:require\s+)?{re.escape(self.module)}\s+(v\S+)", text, re.M)
        if not m:
            raise RuntimeError(f"hack/tools/{self.name}/go.mod does not require {self.module}")
        return m.group(1)

    def bin_dir(self) -> Path:
        return tools_dir() / f"{self.name}-{self.version}" / "bin"

    def ldflags(self) -> str:
        v = self.version
        flags = ["-s", "-w"]
        if self.version_ldflags:
            major, minor = v.lstrip("v").split(".")[:2]
            values = {"version": v, "major": major, "minor": minor}
            flags += ["-X " + f.format(**values) for f in self.version_ldflags]
        return " ".join(flags)


_K8S_VERSION = (
    "k8s.io/component-base/version.gitVersion={version}",
    "k8s.io/component-base/version.gitMajor={major}",
    "k8s.io/component-base/version.gitMinor={minor}",
    "k8s.io/component-base/version.gitTreeState=clean",
)

TOOLSETS = (
    ToolSet(
        "kubernetes",
        "k8s.io/kubernetes",
        {
            name: f"k8s.io/kubernetes/cmd/{name}"
            for name in (
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kubectl",
                "kubelet",
                "kube-proxy",
                "kubeadm",
            )
        },
        _K8S_VERSION,
    ),
    ToolSet("etcd", "go.etcd.io/etcd/server/v3", {"etcd": "go.etcd.io/etcd/server/v3"}),
    ToolSet("kwok", "sigs.k8s.io/kwok", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}),
    ToolSet("helm", "helm.sh/helm/v4", {"helm": "helm.sh/helm/v4/cmd/helm"}),
    ToolSet("kind", "sigs.k8s.io/kind", {"kind": "sigs.k8s.io/kind"}),
    # The kind node image's DNS (atom_localcluster/kindnode.py): CoreDNS with the plugins kubeadm's Corefile uses.
    ToolSet("coredns", "github.com/coredns/coredns", {"coredns": "atom.dev/hack/tools/coredns"}),
    # ... and its default storage (kind installs a local-path provisioner).
    ToolSet("local-path-provisioner", "github.com/rancher/local-path-provisioner",
            {"local-path-provisioner": "github.com/rancher/local-path-provisioner"}, on_demand=True),
    # Prefix-aware routing (tests/routing, make bench-routing): the Gateway API Inference Extension's endpoint
    # picker, v1.5.0 the last release with cmd/epp, and v1.6.0's round-robin lwepp as the cache-blind baseline.
    ToolSet("epp", "sigs.k8s.io/gateway-api-inference-extension",
            {"epp": "sigs.k8s.io/gateway-api-inference-extension/cmd/epp"}, on_demand=True),
    ToolSet("lwepp", "sigs.k8s.io/gateway-api-inference-extension",
            {"lwepp": "sigs.k8s.io/gateway-api-inference-extension/cmd/lwepp"}, on_demand=True),
    # Files, not binaries: prometheus-operator's monitoring.coreos.com CRDs, which the chart's scrape objects and
    # rules are checked against (tests/observability).
    ToolSet("prometheus-operator", "github.com/prometheus-operator/prometheus-operator", {}),
)


def tools_dir() -> Path:
    return Path(os.environ.get("ATOM_TOOLS_DIR") or Path.home() / ".cache" / "atom" / "tools")


def toolset_of(binary: str) -> ToolSet:
    for ts in TOOLSETS:
        if binary in ts.packages:
            return ts
    raise KeyError(f"no pinned tool builds {binary!r}")


def path(binary: str) -> Path:
    """The cached binary, built first if it is missing."""
    ts = toolset_of(binary)
    exe = ts.bin_dir() / binary
    if not exe.exists():
        build(ts)
    return exe


def build(ts: ToolSet, *, log=sys.stderr) -> None:
    """Build every missing binary of ``ts`` in one ``go build`` (they share most packages).

    Checkouts on one machine share the cache, so a build holds the tool's lock: a second ``make tools`` waits and
    then finds the binaries built, instead of sharing (and deleting) the first one's ``bin.partial``.
    """
    if not ts.packages:  # a module of files: `make tools` fetches it into Go's module cache
        module_dir(ts.name)
        return
    out = ts.bin_dir()
    if all((out / b).exists() for b in ts.packages):
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _build_missing(ts, out, log)


def module_dir(name: str) -> Path:
    """The files of the module hack/tools/<name>/go.mod pins, at that version: Go's module cache holds them
    (outside the repo, read-only), downloaded once per machine."""
    ts = next(t for t in TOOLSETS if t.name == name)
    if shutil.which("go") is None:
        raise RuntimeError("fetching a pinned module needs Go (https://go.dev/dl); none is on PATH")
    # Outside any module: the download needs no go.sum, and writes none into hack/tools.
    out = subprocess.run(["go", "mod", "download", "-json", f"{ts.module}@{ts.version}"], cwd=tempfile.gettempdir(),
                         capture_output=True, text=True, timeout=600, env={**os.environ, "GO111MODULE": "on"})
    info = json.loads(out.stdout or "{}")
    if out.returncode != 0 or "Dir" not in info:
        raise RuntimeError(f"go mod download {ts.module}@{ts.version} failed: {info.get('Error') or out.stderr}")
    return Path(info["Dir"])


def _build_missing(ts: ToolSet, out: Path, log) -> None:
    missing = [b for b in ts.packages if not (out / b).exists()]
    if not missing:
        return
    if shutil.which("go") is None:
        raise RuntimeError("building the pinned tools needs Go (https://go.dev/dl); none is on PATH")
    tmp = out.parent / "bin.partial"
    tmp.mkdir(exist_ok=True)
    started = time.monotonic()
    print(f"tools: building {', '.join(missing)} from {ts.module}@{ts.version} ...", file=log, flush=True)
    cmd = ["go", "build", "-trimpath", "-ldflags", ts.ldflags(), "-o", str(tmp) + "/"]
    cmd += [ts.packages[b] for b in missing]
    env = {**os.environ, "CGO_ENABLED": os.environ.get("CGO_ENABLED", "0"), "GOFLAGS": "-mod=mod"}
    subprocess.run(cmd, cwd=GO_MODULES / ts.name, env=env, check=True)
    for b in missing:
        built = tmp / _go_binary_name(ts.packages[b])
        os.replace(built, out / b)  # atomic, so an interrupted build never leaves a half binary in bin/
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"tools: built {ts.name}-{ts.version} in {time.monotonic() - started:.0f}s", file=log, flush=True)


def _go_binary_name(package: str) -> str:
    """The file ``go build -o dir/`` writes: the last path element, skipping a major-version suffix."""
    parts = package.rstrip("/").split("/")
    return parts[-2] if re.fullmatch(r"v\d+", parts[-1]) and len(parts) > 1 else parts[-1]


def kubectl() -> Path:
    """kubectl within one minor of the pinned server: the preinstalled one if it is, else the built one."""
    server_minor = int(toolset_of("kube-apiserver").version.split(".")[1])
    found = shutil.which("kubectl")
    if found:
        try:
            out = subprocess.run(
                [found, "version", "--client", "-o", "yaml"], capture_output=True, text=True, timeout=10
            )
            m = re.search(r"minor:\s*['\"]?(\d+)", out.stdout)
            if m and abs(int(m.group(1)) - server_minor) <= 1:
                return Path(found)
        except (OSError, subprocess.SubprocessError):
            pass
    return path("kubectl")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m atom_localcluster.tools", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build every pinned tool that is not cached yet (except on-demand ones)")
    sub.add_parser("list", help="print each tool's cached path")
    where = sub.add_parser("path", help="print one tool's path, building it if needed")
    where.add_argument("binary")
    args = p.parse_args(argv)
    if args.cmd == "build":
        for ts in TOOLSETS:
            if not ts.on_demand:
                build(ts)
    elif args.cmd == "list":
        for ts in TOOLSETS:
            for b in ts.packages:
                exe = ts.bin_dir() / b
                print(f"{b:26} {exe}{'' if exe.exists() else '  (not built)'}")
    else:
        print(path(args.binary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
