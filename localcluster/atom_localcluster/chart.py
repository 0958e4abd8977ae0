"""The operator's chart and the example AtomDeployment on a cluster where pods really run (the real node, kind):
``helm install`` with given images, ``helm uninstall``, and the example as the small test nodes can hold it.
The real-node tests (tests/realnode/scenario.py) and ``make bench-autoscale`` both take these steps."""

from __future__ import annotations

import subprocess

import yaml

from atom_localcluster import tools
from atom_localcluster.cluster import Cluster
from atom_localcluster.tools import REPO

CHART = REPO / "charts" / "atom-operator"
RELEASE = "atom-operator"
OPERATOR_NAMESPACE = "atom-system"
EXAMPLE = REPO / "examples" / "atomdeployment-pd.yaml"
# The test nodes have this machine's CPUs (2 here), and the operator's default request for the cpu backend is 2 CPUs
# a pod (atom_operator.sizing.CPU_REQUEST): decode, prefill and a rollout's surge pod would not fit.
POD_CPU = "250m"


def split_ref(ref: str) -> tuple[str, str]:
    repo, _, tag = ref.rpartition(":")
    return repo, tag


def helm_install(cluster: Cluster, operator_ref: str, engine_ref: str, timeout: str = "300s") -> None:
    """``helm install`` the chart with the given images; pods never pull (the images are on the node already)."""
    op_repo, op_tag = split_ref(operator_ref)
    eng_repo, eng_tag = split_ref(engine_ref)
    cmd = [
        str(tools.path("helm")), "install", RELEASE, str(CHART), "--kubeconfig", str(cluster.kubeconfig),
        "--namespace", OPERATOR_NAMESPACE, "--create-namespace", "--wait", "--timeout", timeout,
        "--set", f"image.repository={op_repo}", "--set", f"image.tag={op_tag}", "--set", "image.pullPolicy=Never",
        "--set", f"engine.image.repository={eng_repo}", "--set", f"engine.image.tag={eng_tag}",
        "--set", "engine.image.pullPolicy=Never",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        pods = cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "wide", check=False).stdout
        logs = cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=atom-operator",
                               "--tail", "40", check=False)  # fmt: skip
        raise RuntimeError(f"helm install failed: {out.stderr}\n{pods}\n{logs.stdout}{logs.stderr}")


def helm_uninstall(cluster: Cluster) -> None:
    subprocess.run([str(tools.path("helm")), "uninstall", RELEASE, "--kubeconfig", str(cluster.kubeconfig),
                    "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout", "120s"], capture_output=True,
                   timeout=180)  # fmt: skip
    cluster.kubectl("delete", "namespace", OPERATOR_NAMESPACE, "--wait=false", check=False)


def atomdeployment(name: str | None = None) -> dict:
    """examples/atomdeployment-pd.yaml, as users apply it: decode + prefill on the cpu backend with builtin:tiny,
    each pod taking one NPU (rebellions.ai/npu) through resources.limits as an NPU model would; each role asks
    for :data:`POD_CPU`, which the small test nodes can hold."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    if name:
        obj["metadata"]["name"] = name
    for role in ("decode", "prefill"):
        obj["spec"][role].setdefault("resources", {}).setdefault("requests", {})["cpu"] = POD_CPU
    return obj


def client_pod(image: str) -> dict:
    """A pod that idles, to run a client from inside the cluster (``kubectl exec``): through cluster DNS and
    kube-proxy, as the Service's users reach it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client", "labels": {"app": "client"}},
        "spec": {
            "containers": [{"name": "client", "image": image, "imagePullPolicy": "IfNotPresent",
                            "command": ["python3", "-c", "import time\nwhile True: time.sleep(3600)"]}],
            "terminationGracePeriodSeconds": 1,
        },
    }  # fmt: skip
