"""A kind cluster (``make e2e-kind``) with the :class:`~tests.harness.cluster.Cluster` interface the e2e steps use.

It needs Docker and a registry that serves kind's node image (``KIND_NODE_IMAGE`` picks another one); nothing
here can run on a machine without them.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.harness import tools
from tests.harness.cluster import Cluster, HarnessError


@dataclass
class KindCluster(Cluster):
    """``kind create cluster`` on start, ``kind delete cluster`` on stop; its own kubeconfig, never ~/.kube."""

    name: str = ""

    def start(self, timeout: float = 300.0) -> KindCluster:
        self.name = self.name or f"atom-e2e-{uuid.uuid4().hex[:6]}"
        self.workdir = Path(tempfile.mkdtemp(prefix="atom-kind-"))
        self._own_workdir = True
        self.kubeconfig = self.workdir / "kubeconfig"
        self.kubectl_path = tools.kubectl()
        cmd = ["create", "cluster", "--name", self.name, "--kubeconfig", str(self.kubeconfig),
               "--wait", f"{int(timeout)}s"]
        if os.environ.get("KIND_NODE_IMAGE"):
            cmd += ["--image", os.environ["KIND_NODE_IMAGE"]]
        try:
            self.kind(*cmd, timeout=timeout + 120)
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

    def load(self, image: str) -> None:
        """``kind load docker-image``: the image goes into every node's containerd; pods never pull it."""
        self.kind("load", "docker-image", image, "--name", self.name)

    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.get("nodes")["items"]]

    def clusters(self) -> list[str]:
        return self.kind("get", "clusters").stdout.split()
