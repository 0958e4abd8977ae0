"""The cluster steps of ``make bench-autoscale`` beside the chart's (:mod:`atom_localcluster.chart`, which the
real-node tests take too): Ready, a client pod, a spec patch."""

from __future__ import annotations

import json
import time

from atom_localcluster.cluster import Cluster

GROUP = "atomdeployments.serving.atom.dev"


def wait_ready(cluster: Cluster, namespace: str, name: str, timeout: float = 600) -> dict:
    """Until the AtomDeployment's Ready condition is True for its current generation."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        obj = cluster.get(GROUP, name, "-n", namespace)
        status = obj.get("status") or {}
        cond = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
        if status.get("observedGeneration") == obj["metadata"]["generation"] and cond and cond["status"] == "True":
            return obj
        time.sleep(1)
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    raise TimeoutError(f"AtomDeployment {namespace}/{name} not Ready after {timeout:.0f}s\n{pods}")


def patch_spec(cluster: Cluster, namespace: str, name: str, spec: dict) -> None:
    cluster.kubectl("patch", GROUP, name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec}))
