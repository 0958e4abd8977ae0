"""Run the cluster tests against a cluster someone else runs (ATOM_TEST_EXISTING_CLUSTER=1 + KUBECONFIG)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from atom_localcluster import tools
from atom_localcluster.cluster import Cluster


@dataclass
class ExistingCluster(Cluster):
    """The same interface as :class:`Cluster`; nothing is started or stopped."""

    def start(self, timeout: float = 0) -> ExistingCluster:  # noqa: ARG002 - same signature as Cluster.start
        self.kubeconfig = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config")).expanduser()
        self.kubectl_path = tools.kubectl()
        config = yaml.safe_load(self.kubeconfig.read_text())
        current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c for c in config["clusters"] if c["name"] == current["context"]["cluster"])
        self.server = cluster["cluster"]["server"]
        self.audit_log = Path("/nonexistent")  # not ours to read
        ca = cluster["cluster"].get("certificate-authority")
        self.ca_file = Path(ca) if ca else None
        version = json.loads(self.kubectl("version", "-o", "json").stdout)
        self.server_version = version.get("serverVersion", {}).get("gitVersion")
        return self

    def stop(self) -> None:
        pass


def wanted() -> bool:
    return os.environ.get("ATOM_TEST_EXISTING_CLUSTER", "") not in ("", "0", "false")

