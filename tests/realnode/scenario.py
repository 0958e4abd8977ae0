"""The serving scenario, step by step, for any cluster where pods really run (the real node here, kind elsewhere).

A step takes a :class:`~atom_localcluster.cluster.Cluster`-like object (``kubectl``, ``apply``, ``get``,
``kubectl_path``, ``kubeconfig``) and the namespace; nothing here knows how the cluster or its images came to be,
so the kind path calls the same steps after ``kind load`` instead of the containerd import.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
from atom_localcluster.chart import (  # noqa: F401 - the scenario's steps, shared with make bench-autoscale
    OPERATOR_NAMESPACE,
    atomdeployment,
    client_pod,
    helm_install,
    helm_uninstall,
)
from atom_localcluster.cluster import Cluster
from atom_localcluster.realnode import NPU_LABELS, NPU_RESOURCE

from tests.realnode.kube import port_forward, wait_for

REPO = Path(__file__).resolve().parents[2]
HTTP_PORT = 8000
ROLE_LABEL = "app.kubernetes.io/component"
GROUP = "atomdeployments.serving.atom.dev"


def advertise_npus(cluster: Cluster, node: str, npus: int = 4) -> None:
    """Fake NPUs on a node: the labels, and capacity patched into the node's status, as a device plugin's
    extended resource appears (the kubelet keeps extended resources it does not manage)."""
    cluster.kubectl("label", "node", node, "--overwrite", *(f"{k}={v}" for k, v in NPU_LABELS.items()))
    patch = {"status": {"capacity": {NPU_RESOURCE: str(npus)}, "allocatable": {NPU_RESOURCE: str(npus)}}}
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(patch))

    def advertised() -> bool:
        return cluster.get("node", node)["status"].get("allocatable", {}).get(NPU_RESOURCE) == str(npus)

    wait_for(advertised, 60, f"{npus} {NPU_RESOURCE} allocatable on node {node}", cluster)


@contextlib.contextmanager
def openai_api(cluster: Cluster, namespace: str, name: str) -> Iterator[openai.OpenAI]:
    """The openai client on a port-forward to the AtomDeployment's Service (127.0.0.1 only)."""
    with port_forward(cluster, namespace, f"svc/{name}", HTTP_PORT) as port:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(api: openai.OpenAI, content: str = "Hello", max_tokens: int = 8) -> openai.types.chat.ChatCompletion:
    """One chat completion with the served model; asserts tokens came back."""
    model = api.models.list().data[0].id
    out = api.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                      max_tokens=max_tokens)
    assert out.choices[0].finish_reason in ("stop", "length"), out
    assert out.usage is not None and out.usage.completion_tokens >= 1, out
    return out


def delete_and_wait_gone(cluster: Cluster, namespace: str, name: str) -> set[str]:
    """Delete the AtomDeployment; every pod and child must go. Returns the pods' uids (for node-side checks)."""
    uids = {p["metadata"]["uid"] for p in pods(cluster, namespace, name)}
    assert uids, f"no pod of {namespace}/{name} before the delete"
    cluster.kubectl("delete", GROUP, name, "-n", namespace, "--wait=true", "--timeout=120s")
    wait_for(lambda: not pods(cluster, namespace, name), 180, "every engine pod to be gone", cluster)
    for kind in ("deployments", "services", "configmaps"):
        left = cluster.get(kind, "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")["items"]
        assert left == [], f"{kind} left behind: {[o['metadata']['name'] for o in left]}"
    return uids


def owner_status(cluster: Cluster, namespace: str, name: str) -> dict:
    return cluster.get(GROUP, name, "-n", namespace)


def wait_ready(cluster: Cluster, namespace: str, name: str, timeout: float = 600, what: str = "READY") -> dict:
    """Until the AtomDeployment's Ready condition is True for its current generation (the real probes passed)."""

    def ready() -> dict | None:
        obj = owner_status(cluster, namespace, name)
        status = obj.get("status") or {}
        cond = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and cond and cond["status"] == "True" else None

    def explain() -> str:
        pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
        events = cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout
        return f"{pods}\n{events[-3000:]}"

    try:
        return wait_for(ready, timeout, f"AtomDeployment {namespace}/{name} {what}", cluster)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{explain()}") from None


def pods(cluster: Cluster, namespace: str, name: str, role: str | None = None) -> list[dict]:
    selector = f"app.kubernetes.io/instance={name}" + (f",{ROLE_LABEL}={role}" if role else "")
    return cluster.get("pods", "-n", namespace, "-l", selector)["items"]


def running_pods(cluster: Cluster, namespace: str, name: str, role: str) -> list[dict]:
    return [p for p in pods(cluster, namespace, name, role) if not p["metadata"].get("deletionTimestamp")]


def metrics(pod: dict) -> dict[str, float]:
    """The pod's /metrics, fetched from its address (a pod IP in a namespace the test made)."""
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:{HTTP_PORT}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})?\s+(\S+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


# A client inside the cluster: through the Service's DNS name and ClusterIP (kube-proxy), one fresh connection per
# request, until /tmp/stop exists; one line per request.
LOOP = r"""
import json, os, sys, time, urllib.request
url = sys.argv[1]
body = json.dumps({"model": sys.argv[2], "max_tokens": 4,
                   "messages": [{"role": "user", "content": "roll"}]}).encode()
while not os.path.exists("/tmp/stop"):
    try:
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.load(r)
        print("ok", out["usage"]["completion_tokens"], flush=True)
    except Exception as e:
        detail = e.read().decode(errors="replace") if hasattr(e, "read") else ""
        print("fail", time.time(), type(e).__name__, (str(e) + " " + detail).replace("\n", " ")[:300], flush=True)
    time.sleep(0.2)
print("done", flush=True)
"""


@dataclass
class LoopingClient:
    """``kubectl exec`` of LOOP in a client pod; ``results`` collects its lines as they come."""

    cluster: Cluster
    namespace: str
    pod: str
    url: str
    model: str
    results: list[str] = field(default_factory=list)

    @contextlib.contextmanager
    def running(self) -> Iterator[LoopingClient]:
        import threading

        self.cluster.kubectl("exec", "-n", self.namespace, self.pod, "--", "rm", "-f", "/tmp/stop")
        cmd = [str(self.cluster.kubectl_path), "--kubeconfig", str(self.cluster.kubeconfig), "exec", "-n",
               self.namespace, self.pod, "--", "python3", "-c", LOOP, self.url, self.model]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: self.results.extend(line.strip() for line in proc.stdout),
                                  daemon=True)
        reader.start()
        try:
            yield self
        finally:
            self.cluster.kubectl("exec", "-n", self.namespace, self.pod, "--", "touch", "/tmp/stop", check=False)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            reader.join(10)

    def oks(self) -> int:
        return sum(1 for r in self.results if r.startswith("ok"))

    def failures(self) -> list[str]:
        return [r for r in self.results if not r.startswith(("ok", "done"))]


def patch_spec(cluster: Cluster, namespace: str, name: str, spec: dict) -> None:
    cluster.kubectl("patch", GROUP, name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec}))
