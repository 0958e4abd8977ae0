"""One routing comparison run on the harness: an AtomDeployment's decode pods, fresh engines, a router, the workload.

Shared by the test (tests/routing/test_prefix_routing.py) and ``make bench-routing``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from atom_localcluster import gie
from atom_localcluster.cluster import Cluster
from atom_localcluster.processes import Processes
from atom_localcluster.routing import stack
from atom_localcluster.routing.workload import Result, Workload, run

# GIE's EPP (prefix and load aware); Envoy's random pick (what a Service does); GIE v1.6.0's lwepp (round robin,
# cache-blind), both pickers through the same Envoy.
ROUTERS = ("epp", "random", "lwepp")
MODEL = "builtin:smollm2-135m"
# (lanes, kvBlocks) per replica. The engine's default kvBlocks; 2 lanes, so that two requests on one replica batch
# as a serving replica does (the default is 4) instead of one queueing behind the other: with 1 lane, queueing
# behind a replica's one request, not the cache, set TTFT p90. The prefix cache holds kvBlocks - 1 - (busy lanes)
# = 5 to 7 whole-sequence entries, and a prefix in use takes two (the entry a request copied from and the one it
# leaves), so a replica keeps about 3 of the workload's 6 prefixes (atom_localcluster/routing/workload.py): they
# fit the two replicas together, not one.
SIZING = (2, 8)


def atom_deployment(name: str, namespace: str, *, lanes: int, kv_blocks: int, routing: bool = True) -> dict:
    spec: dict = {
        "model": {"source": MODEL, "maxSeqLen": 512},
        "decode": {"replicas": 2, "backend": "cpu", "npusPerReplica": 0, "lanes": lanes, "kvBlocks": kv_blocks,
                   "prefixCache": True, "nodeSelector": {"rebellions.ai/npu.present": "true"}},
    }
    if routing:
        spec["routing"] = {"inferencePool": {"enabled": True}}
    return {"apiVersion": "serving.atom.dev/v1alpha1", "kind": "AtomDeployment",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def install_crds(cluster: Cluster) -> None:
    """The AtomDeployment CRD and GIE's InferencePool CRD (from the pinned module)."""
    from atom_operator.api.crd import render

    cluster.kubectl("apply", "-f", "-", input=render())
    cluster.kubectl("apply", "--server-side", "-f", str(gie.pool_crd()))
    for crd in ("atomdeployments.serving.atom.dev", gie.POOL_CRD_NAME):
        cluster.wait_crd_established(crd)


def deploy(cluster: Cluster, namespace: str, name: str, timeout: float = 120) -> None:
    """The AtomDeployment with spec.routing.inferencePool on: the operator's InferencePool, two decode pods Ready."""
    lanes, kv_blocks = SIZING
    cluster.apply(atom_deployment(name, namespace, lanes=lanes, kv_blocks=kv_blocks))
    wait_decode_ready(cluster, namespace, name, 2, timeout)
    end = time.monotonic() + timeout
    while cluster.kubectl("get", "inferencepool", "-n", namespace, name, check=False).returncode != 0:
        if time.monotonic() > end:
            raise RuntimeError(f"the operator made no InferencePool {namespace}/{name} in {timeout:.0f}s")
        time.sleep(0.5)


def wait_decode_ready(cluster: Cluster, namespace: str, name: str, replicas: int, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pods = stack.decode_pods(cluster, namespace, name)
        ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in p.get("status", {}).get("conditions", []))]
        if len(pods) == replicas and len(ready) == replicas:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{name}: {replicas} decode pods were not Ready in {timeout:.0f}s")


def one_run(router: str, cluster: Cluster, namespace: str, name: str, workload: Workload, workdir: Path,
            tag: str) -> Result:
    """Fresh engines (empty prefix caches) for the decode pods, ``router`` in front of them, the workload once."""
    procs = Processes(workdir)
    try:
        pods = stack.start_engines(cluster, namespace, name, procs, tag)
        url = stack.start_router(router, cluster, namespace, name, pods, procs, tag)
        model = name  # the engine serves the deployment's name (settings.modelName)
        return asyncio.run(run(url, [p.url for p in pods], model, workload))
    finally:
        procs.stop()
