"""The real node works as a node: pods run, and logs, exec, port-forward, Services and cluster DNS all work."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
from atom_localcluster.realnode import NODE_NAME, NPU_LABELS, NPU_RESOURCE, RealNodeCluster

from tests.realnode.kube import port_forward, wait_for

pytestmark = pytest.mark.realnode

GREETING = "hello from the real node"
# A python3 web server that says hello on stdout (for `kubectl logs`) and serves its own hostname.
SERVER = (
    "import http.server, socket, sys\n"
    f"print({GREETING!r}, flush=True)\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = socket.gethostname().encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "http.server.ThreadingHTTPServer(('0.0.0.0', 8080), H).serve_forever()\n"
)


def web_pod(name: str, image: str, labels: dict[str, str], limits: dict[str, str] | None = None) -> dict:
    container = {
        "name": "web",
        "image": image,
        "imagePullPolicy": "Never",  # imported into the node's containerd; nothing can be pulled here
        "command": ["python3", "-c", SERVER],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    }
    if limits:
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1},
    }


def wait_pod_ready(node: RealNodeCluster, namespace: str, name: str, timeout: float = 120) -> dict:
    def ready() -> dict | None:
        pod = node.get("pod", name, "-n", namespace)
        conds = pod["status"].get("conditions", [])
        return pod if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else None

    return wait_for(ready, timeout, f"pod {namespace}/{name} Ready", node)


@pytest.fixture
def web(real_node: RealNodeCluster, namespace: str, base_image: str) -> Iterator[dict]:
    real_node.apply(web_pod("web", base_image, {"app": "web"}), "-n", namespace)
    yield wait_pod_ready(real_node, namespace, "web")


def test_node_is_ready_with_npu_labels(real_node: RealNodeCluster) -> None:
    node = real_node.get("node", NODE_NAME)
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    assert NPU_LABELS.items() <= node["metadata"]["labels"].items()
    assert node["status"]["allocatable"][NPU_RESOURCE] == "4"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def test_pod_requesting_an_npu_runs_on_the_node(real_node: RealNodeCluster, namespace: str, base_image: str) -> None:
    real_node.apply(web_pod("npu", base_image, {"app": "npu"}, {NPU_RESOURCE: "1"}), "-n", namespace)
    pod = wait_pod_ready(real_node, namespace, "npu")
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"]["podIP"].startswith("10.244.")


def test_logs(real_node: RealNodeCluster, namespace: str, web: dict) -> None:
    assert GREETING in real_node.kubectl("logs", "-n", namespace, "web").stdout


def test_exec(real_node: RealNodeCluster, namespace: str, web: dict) -> None:
    out = real_node.kubectl("exec", "-n", namespace, "web", "--", "cat", "/etc/hostname").stdout
    assert out.strip() == "web"


def test_port_forward(real_node: RealNodeCluster, namespace: str, web: dict) -> None:
    with port_forward(real_node, namespace, "pod/web", 8080) as port:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.read() == b"web"


def test_service_cluster_ip_and_dns_from_a_pod(real_node: RealNodeCluster, namespace: str, web: dict) -> None:
    """kube-proxy routes the ClusterIP and the cluster DNS names it, seen from another pod on the node."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    real_node.apply(service, "-n", namespace)
    cluster_ip = real_node.get("service", "web", "-n", namespace)["spec"]["clusterIP"]
    real_node.apply(web_pod("client", web["spec"]["containers"][0]["image"], {"app": "client"}), "-n", namespace)
    wait_pod_ready(real_node, namespace, "client")
    fetch = (
        "import socket, sys, urllib.request\n"
        "host = sys.argv[1]\n"
        "print(socket.gethostbyname(host), urllib.request.urlopen(f'http://{host}/', timeout=5).read().decode())\n"
    )

    def through(host: str) -> str | None:
        # The Service's endpoints appear a moment after the pod is Ready: retry until kube-proxy has them.
        out = real_node.kubectl("exec", "-n", namespace, "client", "--", "python3", "-c", fetch, host, check=False)
        return out.stdout.split() if out.returncode == 0 else None

    assert wait_for(lambda: through(cluster_ip), 60, f"GET http://{cluster_ip}/ from a pod", real_node) == [
        cluster_ip,
        "web",
    ]
    assert wait_for(lambda: through(f"web.{namespace}.svc"), 30, "GET http://web.<ns>.svc/ from a pod", real_node) == [
        cluster_ip,
        "web",
    ]


def test_kubelet_is_not_open_to_anonymous_clients(real_node: RealNodeCluster) -> None:
    out = subprocess.run(
        ["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", f"https://127.0.0.1:{real_node.kubelet_port}/pods"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout == "401"


def test_pod_ip_answers_from_the_host(real_node: RealNodeCluster, namespace: str, web: dict) -> None:
    ip = web["status"]["podIP"]
    with urllib.request.urlopen(f"http://{ip}:8080/", timeout=10) as r:
        assert r.read() == b"web"


def test_deleted_pod_leaves_no_container(real_node: RealNodeCluster, namespace: str, web: dict) -> None:
    containerd = real_node.containerd
    assert containerd is not None
    uid = web["metadata"]["uid"]

    def containers_of_pod() -> list[str]:
        return [
            cid
            for cid in containerd.containers()
            if json.loads(containerd.ctr("containers", "info", cid).stdout)["Labels"].get("io.kubernetes.pod.uid")
            == uid
        ]

    assert len(containers_of_pod()) == 2  # the sandbox (pause) and the web container
    real_node.kubectl("delete", "pod", "web", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(lambda: not containers_of_pod(), 60, f"containerd to drop the containers of pod {uid}", real_node)
