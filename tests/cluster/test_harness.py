"""The control plane the other tests rely on is real: controllers, scheduler, RBAC and fake NPU nodes work."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from atom_localcluster import tools
from atom_localcluster.cluster import Cluster, FakeNode, _alive
from atom_localcluster.wait import wait_for
from atom_operator.npu import rngd_partitions_per_card

pytestmark = pytest.mark.cluster


def deployment(name: str, namespace: str, atom: int, replicas: int = 1) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "example.invalid/none:0",  # kwok runs nothing, so no image is pulled
                            "resources": {"limits": {"rebellions.ai/npu": str(atom)}},
                        }
                    ],
                },
            },
        },
    }


def test_nodes_advertise_npus_under_both_atom_schemes_with_the_vendors_labels(cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in cluster.get("nodes")["items"]}
    atom = [n for n in nodes.values() if n["metadata"]["labels"].get("rebellions.ai/npu.present") == "true"]
    rngd = [n for n in nodes.values() if n["metadata"]["labels"].get("furiosa.ai/npu.family") == "rngd"]
    generic = [n for n in atom if "rebellions.ai/npu" in n["status"]["allocatable"]]
    legacy = [n for n in atom if "rebellions.ai/ATOM" in n["status"]["allocatable"]]
    assert len(generic) >= 2 and len(legacy) >= 1 and len(rngd) >= 1
    assert not [n for n in generic if n in legacy], "a node advertises one scheme, never both"
    for n in atom:
        labels = n["metadata"]["labels"]
        assert labels["rebellions.ai/npu.family"] == "ATOM"
        assert labels["rebellions.ai/npu.product"] == "RBLN-CA22"
        assert labels["rebellions.ai/npu.count"] == "4"
        npus = {k: v for k, v in n["status"]["allocatable"].items() if k.startswith("rebellions.ai/")}
        assert list(npus.values()) == ["4"], npus
    for n in rngd:
        labels = n["metadata"]["labels"]
        ((resource, units),) = [(k, v) for k, v in n["status"]["allocatable"].items() if k.startswith("furiosa.ai/")]
        cards = int(labels["furiosa.ai/npu.count"])
        assert int(units) == cards * rngd_partitions_per_card(resource) and cards >= 1, (resource, units, cards)
        assert labels["furiosa.ai/npu.product"] in ("rngd", "rngd-s", "rngd-max")
        assert labels["furiosa.ai/driver.version"]
        assert "furiosa.ai/npu.present" not in labels  # Furiosa's feature discovery writes no such label
    for n in nodes.values():
        ready = next(c for c in n["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", n["metadata"]["name"]


def test_deployment_requesting_an_npu_runs_on_an_atom_node(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("npu", namespace, atom=1, replicas=2))
    cluster.kubectl("-n", namespace, "rollout", "status", "deployment/npu", "--timeout=60s", timeout=70)
    rs = cluster.get("-n", namespace, "replicasets")["items"]
    assert len(rs) == 1 and rs[0]["metadata"]["ownerReferences"][0]["name"] == "npu"
    pods = cluster.get("-n", namespace, "pods")["items"]
    assert len(pods) == 2
    for p in pods:
        node = cluster.get("node", p["spec"]["nodeName"])
        assert node["metadata"]["labels"]["rebellions.ai/npu.family"] == "ATOM"
        assert p["status"]["phase"] == "Running"
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])


def test_pod_needing_more_npus_than_any_node_stays_pending(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("greedy", namespace, atom=9))

    def failed_scheduling():
        events = cluster.get("-n", namespace, "events", "--field-selector", "reason=FailedScheduling")["items"]
        return [e["message"] for e in events]

    messages = wait_for(failed_scheduling, what="a FailedScheduling event")
    assert any("Insufficient rebellions.ai/npu" in m for m in messages), messages
    pods = cluster.get("-n", namespace, "pods")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Pending"]


def test_deleting_a_deployment_garbage_collects_its_replicasets_and_pods(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("gc", namespace, atom=1))
    cluster.kubectl("-n", namespace, "rollout", "status", "deployment/gc", "--timeout=60s", timeout=70)
    cluster.kubectl("-n", namespace, "delete", "deployment", "gc", "--cascade=background")
    wait_for(lambda: not cluster.get("-n", namespace, "replicasets")["items"], what="ReplicaSets to be collected")
    wait_for(lambda: not cluster.get("-n", namespace, "pods")["items"], what="Pods to be collected")


def test_rbac_denies_a_service_account_without_a_role(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("-n", namespace, "create", "serviceaccount", "nobody")
    token = cluster.kubectl("-n", namespace, "create", "token", "nobody").stdout.strip()
    as_sa = [
        str(cluster.kubectl_path),
        "--server",
        cluster.server,
        "--certificate-authority",
        str(cluster.ca_file),
        "--token",
        token,
        "--kubeconfig",
        "/dev/null",
        "-n",
        namespace,
    ]
    denied = subprocess.run([*as_sa, "get", "pods"], capture_output=True, text=True, timeout=30)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower() and f"system:serviceaccount:{namespace}:nobody" in denied.stderr
    allowed = subprocess.run([*as_sa, "auth", "whoami"], capture_output=True, text=True, timeout=30)
    assert allowed.returncode == 0, allowed.stderr  # the token itself authenticates
    assert cluster.kubectl("-n", namespace, "get", "pods").returncode == 0  # the admin is allowed
    can = cluster.kubectl(
        "auth",
        "can-i",
        "get",
        "secrets",
        "-n",
        namespace,
        "--as",
        f"system:serviceaccount:{namespace}:nobody",
        check=False,
    )
    assert can.stdout.strip() == "no"


def test_kubectl_version_reports_the_pinned_server(cluster: Cluster) -> None:
    pinned = tools.toolset_of("kube-apiserver").version
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == pinned
    client_minor = int(version["clientVersion"]["minor"].rstrip("+"))
    assert abs(client_minor - int(pinned.split(".")[1])) <= 1


def test_a_second_cluster_runs_beside_the_first_and_leaves_nothing_behind(cluster: Cluster) -> None:
    with Cluster(nodes=(FakeNode("solo", {}, {}),)) as second:
        assert second.server != cluster.server
        assert second.get("nodes")["items"][0]["metadata"]["name"] == "solo"
        pids = [c.proc.pid for c in second.components]
        workdir = second.workdir
        port = int(second.server.rsplit(":", 1)[1])
    assert workdir is not None and not workdir.exists()
    assert not [p for p in pids if _alive(p) and not _zombie(p)]
    import socket

    with socket.socket() as s:  # the API server's port is free again
        s.bind(("127.0.0.1", port))


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except OSError:
        return True


def test_component_failure_names_the_component_and_its_log(tmp_path, monkeypatch) -> None:
    # An etcd that cannot start (its data dir is a file) must be reported with its own last log lines.
    from atom_localcluster.cluster import HarnessError

    (tmp_path / "etcd").write_text("not a directory")
    with pytest.raises(HarnessError) as err:
        Cluster(workdir=tmp_path, nodes=()).start(timeout=30)
    assert "etcd" in str(err.value) and "last log lines" in str(err.value)
    assert os.path.exists(tmp_path / "etcd.log")
