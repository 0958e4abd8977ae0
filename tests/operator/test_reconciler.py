"""The reconciler on the real control plane with fake NPU nodes: one namespace per test, one operator per session."""

from __future__ import annotations

import json

import pytest
import yaml
from atom_localcluster.wait import wait_for
from atom_operator.api import AtomDeploymentSpec
from atom_operator.children import Defaults, Owner, build_children
from atom_operator.children.meta import CONFIG_HASH

from tests.operator.conftest import SMALL_POOL, atomdeployment
from tests.operator.process import OperatorProcess

pytestmark = pytest.mark.cluster

PD = {
    "decode": {"replicas": 2, "npusPerReplica": 1, "lanes": 1, "kvBlocks": 3, "localPrefill": False},
    "prefill": {"replicas": 1, "backend": "rngd", "npusPerReplica": 1, "prefetchNext": True},
}
KINDS = "deployments,services,configmaps"


def get(cluster, namespace: str, name: str = "llm") -> dict:
    return cluster.get("atomdeployment", name, "-n", namespace)


def condition(obj: dict, type_: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def ready(cluster, namespace: str, name: str = "llm") -> dict | None:
    obj = get(cluster, namespace, name)
    ok = condition(obj, "Ready").get("status") == "True"
    return obj if ok and obj["status"].get("observedGeneration") == obj["metadata"]["generation"] else None


def children(cluster, namespace: str) -> dict[tuple[str, str], dict]:
    items = cluster.get(KINDS, "-n", namespace, "-l", "serving.atom.dev/deployment")["items"]
    return {(i["kind"], i["metadata"]["name"]): i for i in items}


def pods(cluster, namespace: str, component: str) -> list[dict]:
    sel = f"app.kubernetes.io/component={component}"
    return cluster.get("pods", "-n", namespace, "-l", sel)["items"]


def expected(cluster, namespace: str, spec: dict, name: str = "llm") -> list[dict]:
    uid = get(cluster, namespace, name)["metadata"]["uid"]
    owner = Owner(name, namespace, uid, AtomDeploymentSpec.model_validate(spec, strict=False))
    return build_children(owner, Defaults(image="example.invalid/atom-engine:test")).desired


def assert_subset(actual, wanted, path="") -> None:
    """Every field we asked for is there, exactly (the API server adds its defaults around them)."""
    if isinstance(wanted, dict):
        for k, v in wanted.items():
            assert isinstance(actual, dict) and k in actual, f"{path}.{k} missing"
            assert_subset(actual[k], v, f"{path}.{k}")
    elif isinstance(wanted, list):
        assert isinstance(actual, list) and len(actual) == len(wanted), f"{path}: {actual!r} != {wanted!r}"
        for i, (a, w) in enumerate(zip(actual, wanted, strict=True)):
            assert_subset(a, w, f"{path}[{i}]")
    else:
        assert actual == wanted, f"{path}: {actual!r} != {wanted!r}"


def assert_children_exactly(cluster, namespace: str, spec: dict) -> None:
    """The children the spec asks for, each controlled by the AtomDeployment alone: no duplicate, no orphan."""
    found = children(cluster, namespace)
    want = expected(cluster, namespace, spec)
    assert sorted(found) == sorted((c["kind"], c["metadata"]["name"]) for c in want)
    uid = get(cluster, namespace)["metadata"]["uid"]
    for child in found.values():
        assert [r["uid"] for r in child["metadata"]["ownerReferences"]] == [uid]


def create(cluster, namespace: str, name: str = "llm", **spec) -> dict:
    manifest = atomdeployment(name, namespace, **spec)
    cluster.apply(manifest)
    return manifest["spec"]


def test_create_makes_every_child_exactly_and_pods_become_ready_on_atom_and_rngd(cluster, op, namespace) -> None:
    spec = create(cluster, namespace, **PD)
    obj = wait_for(lambda: ready(cluster, namespace), "Ready")
    found = children(cluster, namespace)
    want = expected(cluster, namespace, spec)
    assert sorted(found) == sorted((c["kind"], c["metadata"]["name"]) for c in want)
    for child in want:
        assert_subset(found[(child["kind"], child["metadata"]["name"])], child)
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in cluster.get("nodes")["items"]}
    for component, (label, value) in (
        ("decode", ("rebellions.ai/npu.present", "true")),
        ("prefill", ("furiosa.ai/npu.family", "rngd")),
    ):
        running = pods(cluster, namespace, component)
        assert len(running) == spec[component]["replicas"]
        for p in running:
            assert nodes[p["spec"]["nodeName"]].get(label) == value
            assert any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
    assert obj["status"]["endpoint"] == f"http://llm.{namespace}.svc:8000/v1"
    assert obj["status"]["decode"] == {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "summary": "2/2"}
    assert obj["status"]["prefill"]["summary"] == "1/1"
    assert condition(obj, "Degraded")["status"] == "False" and condition(obj, "Progressing")["status"] == "False"
    reasons = [
        e["reason"]
        for e in cluster.get("events", "-n", namespace)["items"]
        if e["source"].get("component") == "atom-operator"
    ]
    assert reasons.count("ChildCreated") == len(want)
    printed = cluster.kubectl("get", "atomdeployments", "-n", namespace).stdout
    assert "2/2" in printed and "1/1" in printed and "True" in printed


def test_a_settings_change_rewrites_the_config_and_rolls_the_pods(cluster, op, namespace) -> None:
    create(cluster, namespace, decode={"replicas": 2, "lanes": 2, "kvBlocks": 4})
    wait_for(lambda: ready(cluster, namespace), "Ready")
    before = children(cluster, namespace)[("Deployment", "llm-decode")]
    old_hash = before["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH]
    old_pods = {p["metadata"]["name"] for p in pods(cluster, namespace, "decode")}
    patch = {"spec": {"decode": {"lanes": 3, "kvBlocks": 5}}}
    cluster.kubectl("patch", "atomdeployment", "llm", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    wait_for(lambda: ready(cluster, namespace), "Ready after the change")
    after = children(cluster, namespace)
    settings = yaml.safe_load(after[("ConfigMap", "llm-decode-config")]["data"]["engine.yaml"])
    assert (settings["lanes"], settings["kvBlocks"]) == (3, 5)
    new_hash = after[("Deployment", "llm-decode")]["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH]
    assert new_hash != old_hash
    new_pods = wait_for(
        lambda: (
            {p["metadata"]["name"] for p in pods(cluster, namespace, "decode")}
            if len(pods(cluster, namespace, "decode")) == 2
            else None
        ),
        "two pods",
    )
    assert not new_pods & old_pods
    assert all(p["metadata"]["annotations"][CONFIG_HASH] == new_hash for p in pods(cluster, namespace, "decode"))


def test_kubectl_scale_scales_decode(cluster, op, namespace) -> None:
    create(cluster, namespace, decode={"replicas": 1})
    wait_for(lambda: ready(cluster, namespace), "Ready")
    cluster.kubectl("scale", "atomdeployment/llm", "-n", namespace, "--replicas=3")
    obj = wait_for(lambda: ready(cluster, namespace), "Ready at 3")
    assert obj["status"]["decode"]["readyReplicas"] == 3
    assert children(cluster, namespace)[("Deployment", "llm-decode")]["spec"]["replicas"] == 3
    scale = cluster.get("atomdeployment", "llm", "-n", namespace, "--subresource=scale")
    assert scale["status"]["replicas"] == 3 and "app.kubernetes.io/component=decode" in scale["status"]["selector"]


def test_more_npus_than_the_nodes_have_is_degraded_with_the_shortfall(cluster, op, namespace) -> None:
    create(cluster, namespace, decode={"replicas": 3, "npusPerReplica": 4, "nodeSelector": {SMALL_POOL: "small"}})

    shortfall = "decode: 2 of 3 pods Pending: insufficient rebellions.ai/npu (each needs 4)"

    def degraded():
        obj = get(cluster, namespace)
        return obj if condition(obj, "Degraded").get("message") == shortfall else None

    obj = wait_for(degraded, f"Degraded saying {shortfall!r}")
    assert condition(obj, "Degraded")["status"] == "True"
    assert condition(obj, "Degraded")["reason"] == "InsufficientNPUs"
    assert condition(obj, "Ready")["status"] == "False"


def test_prefill_replicas_to_zero_removes_the_prefill_children(cluster, op, namespace) -> None:
    create(cluster, namespace, **PD)
    wait_for(lambda: ready(cluster, namespace), "Ready")
    patch = {"spec": {"decode": {"localPrefill": True}, "prefill": {"replicas": 0, "prefetchNext": False}}}
    cluster.kubectl("patch", "atomdeployment", "llm", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    wait_for(lambda: ready(cluster, namespace), "Ready without prefill")
    names = sorted(children(cluster, namespace))
    assert names == [("ConfigMap", "llm-decode-config"), ("Deployment", "llm-decode"), ("Service", "llm")]
    settings = yaml.safe_load(children(cluster, namespace)[("ConfigMap", "llm-decode-config")]["data"]["engine.yaml"])
    assert "prefillWorkers" not in settings


def test_a_hand_deleted_child_is_recreated_and_a_hand_edited_one_reverted(cluster, op, namespace) -> None:
    create(cluster, namespace)
    wait_for(lambda: ready(cluster, namespace), "Ready")
    svc_uid = children(cluster, namespace)[("Service", "llm")]["metadata"]["uid"]
    cluster.kubectl("delete", "service", "llm", "-n", namespace)
    wait_for(
        lambda: (
            children(cluster, namespace).get(("Service", "llm"), {}).get("metadata", {}).get("uid")
            not in (None, svc_uid)
        ),
        "the Service recreated",
    )
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil.invalid/x:1"}]
    cluster.kubectl("patch", "deployment", "llm-decode", "-n", namespace, "--type=json", "-p", json.dumps(patch))
    cluster.kubectl(
        "patch",
        "configmap",
        "llm-decode-config",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"data":{"engine.yaml":"lanes: 99\\n"}}',
    )

    def reverted():
        kids = children(cluster, namespace)
        image = kids[("Deployment", "llm-decode")]["spec"]["template"]["spec"]["containers"][0]["image"]
        return (
            image == "example.invalid/atom-engine:test"
            and "lanes: 99" not in kids[("ConfigMap", "llm-decode-config")]["data"]["engine.yaml"]
        )

    wait_for(reverted, "hand edits reverted")


def test_deleting_the_atomdeployment_garbage_collects_every_child(cluster, op, namespace) -> None:
    create(cluster, namespace, **PD)
    wait_for(lambda: ready(cluster, namespace), "Ready")
    cluster.kubectl("delete", "atomdeployment", "llm", "-n", namespace)
    wait_for(lambda: not children(cluster, namespace), "children gone")
    wait_for(lambda: not cluster.get("pods,replicasets", "-n", namespace)["items"], "pods and ReplicaSets gone")


# Writes of a PD create: ConfigMaps and Services, then Deployments, an Event for each as it is written, then status.
@pytest.mark.parametrize("crash_after_write", [1, 4, 7, 9, 11, 13])
def test_operator_killed_in_the_middle_of_a_create_converges(
    cluster, op: OperatorProcess, namespace, crash_after_write
) -> None:
    op.stop()
    op.start(ATOM_FAILPOINT=f"exit-after-write:{crash_after_write}:{namespace}")
    spec = create(cluster, namespace, **PD)
    assert op.wait_exit(timeout=120) == 137, op.log()[-3000:]
    assert len(op.writes(namespace)) >= crash_after_write
    op.start()
    wait_for(lambda: ready(cluster, namespace), "Ready after the restart")
    assert_children_exactly(cluster, namespace, spec)
    for component in ("decode", "prefill"):
        assert len(pods(cluster, namespace, component)) == spec[component]["replicas"]
    assert len(cluster.get("replicasets", "-n", namespace)["items"]) == 2
