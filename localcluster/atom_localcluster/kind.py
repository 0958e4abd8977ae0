"""A kind cluster (``make e2e-kind``) with the :class:`~atom_localcluster.cluster.Cluster` interface the e2e steps use.

By default the node image is the one built here from the pinned parts (atom_localcluster/kindnode.py, cached by its
recipe's hash) with its cluster config (one node, the pre-loaded control-plane images, the bridge CNI).
``KIND_NODE_IMAGE`` picks another image, e.g. a kindest/node release where a registry serves it; kind's own
defaults (kindnetd, ...) apply then.

``kind delete cluster`` runs when the cluster stops, also when starting failed, on SIGTERM/SIGHUP (turned into
an exception so ``finally`` blocks run) and, from .ci/run's trap, when the whole run is killed: the cluster is
named ``$ATOM_KIND_CLUSTER`` when that is set, so the trap knows which one to delete.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from atom_localcluster import kindnode, runc_caps, tools
from atom_localcluster.cluster import Cluster, HarnessError
from atom_localcluster.images.daemon import cache_dir, docker, ensure_daemon

DAEMON_JSON = Path("/etc/docker/daemon.json")
RUNTIME = "atom-runc"


def ensure_privileged_runtime(timeout: float = 30.0) -> None:
    """Where root's capability bounding set lacks some capability, make atom_localcluster/runc_caps.py Docker's
    default runtime (kind gives no way to pick a runtime per node), so ``docker run --privileged`` starts.

    The wrapper is copied out of the checkout (the daemon outlives it), registered in /etc/docker/daemon.json
    (kept for later daemon starts; other settings there are kept) and loaded with SIGHUP, which dockerd applies
    to ``runtimes`` and ``default-runtime`` without a restart. Elsewhere nothing changes.
    """
    if not runc_caps.missing_caps():
        return
    ensure_daemon()
    wrapper = cache_dir() / "docker" / RUNTIME
    source = Path(runc_caps.__file__).read_bytes()
    if not wrapper.exists() or wrapper.read_bytes() != source:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        tmp = wrapper.with_suffix(".tmp")
        tmp.write_bytes(source)
        tmp.chmod(0o755)
        os.replace(tmp, wrapper)
    config = json.loads(DAEMON_JSON.read_text()) if DAEMON_JSON.exists() else {}
    want = {"runtimes": {**config.get("runtimes", {}), RUNTIME: {"path": str(wrapper)}}, "default-runtime": RUNTIME}
    if {**config, **want} != config:
        DAEMON_JSON.parent.mkdir(parents=True, exist_ok=True)
        DAEMON_JSON.write_text(json.dumps({**config, **want}, indent=2) + "\n")
    deadline = time.monotonic() + timeout
    while docker("info", "--format", "{{.DefaultRuntime}}").stdout.strip() != RUNTIME:
        if time.monotonic() > deadline:
            raise HarnessError(f"dockerd did not take {RUNTIME} as its default runtime from {DAEMON_JSON}")
        os.kill(int(Path("/var/run/docker.pid").read_text().strip()), signal.SIGHUP)
        time.sleep(1)


@dataclass
class KindCluster(Cluster):
    """``kind create cluster`` on start, ``kind delete cluster`` on stop; its own kubeconfig, never ~/.kube."""

    name: str = ""
    image: str = ""

    def start(self, timeout: float = 600.0) -> KindCluster:
        self.name = self.name or os.environ.get("ATOM_KIND_CLUSTER") or f"atom-e2e-{uuid.uuid4().hex[:6]}"
        self.workdir = Path(tempfile.mkdtemp(prefix="atom-kind-"))
        self._own_workdir = True
        self.kubeconfig = self.workdir / "kubeconfig"
        self.kubectl_path = tools.kubectl()
        cmd = ["create", "cluster", "--name", self.name, "--kubeconfig", str(self.kubeconfig),
               "--wait", f"{int(timeout)}s"]
        ensure_privileged_runtime()
        if os.environ.get("KIND_NODE_IMAGE"):
            self.image = os.environ["KIND_NODE_IMAGE"]
        else:
            self.image = kindnode.build()
            config = self.workdir / "kind-config.json"  # YAML is a superset of JSON: kind reads it as is
            config.write_text(json.dumps(kindnode.cluster_config(), indent=2))
            cmd += ["--config", str(config)]
        cmd += ["--image", self.image]
        try:
            self.kind(*cmd, timeout=timeout + 300)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.name:
            self.kind("delete", "cluster", "--name", self.name, "--kubeconfig", str(self.kubeconfig), check=False,
                      timeout=300)
        if self.workdir is not None and self._own_workdir:
            subprocess.run(["rm", "-rf", str(self.workdir)], check=False)

    def kind(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        cmd = [str(tools.path("kind")), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise HarnessError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-3000:]}")
        return out

    def load(self, image: str) -> float:
        """``kind load docker-image``: the image goes into every node's containerd; pods never pull it.
        Returns the seconds it took."""
        started = time.monotonic()
        self.kind("load", "docker-image", image, "--name", self.name, timeout=1800)
        return time.monotonic() - started

    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.get("nodes")["items"]]

    def pod_uids_with_containers(self) -> set[str]:
        """The pod uids that still have a container in some node's containerd (kind's nodes are containers)."""
        uids: set[str] = set()
        for node in self.kind("get", "nodes", "--name", self.name).stdout.split():
            script = ("for c in $(ctr -n k8s.io containers list -q); do ctr -n k8s.io containers info $c; done "
                      "| jq -r '.Labels[\"io.kubernetes.pod.uid\"] // empty'")
            out = subprocess.run(["docker", "exec", node, "bash", "-c", script], capture_output=True, text=True,
                                 timeout=120)
            if out.returncode != 0:
                raise HarnessError(f"listing containers on kind node {node} failed: {out.stderr[-2000:]}")
            uids.update(out.stdout.split())
        return uids

    def clusters(self) -> list[str]:
        return self.kind("get", "clusters").stdout.split()


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived; raised so that cleanup in ``finally`` blocks runs (pytest would just die)."""


@contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into :class:`Terminated` for the block's length (main thread only)."""

    def raise_terminated(signum: int, _frame: object) -> None:
        raise Terminated(f"signal {signal.Signals(signum).name}")

    previous = {s: signal.signal(s, raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
