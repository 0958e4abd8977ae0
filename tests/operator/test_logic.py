"""The applier's diff and the status computation, without any API server."""

from __future__ import annotations

import copy

from atom_operator.api import AtomDeploymentSpec
from atom_operator.apply import contains, needs_write
from atom_operator.children import Defaults, Owner, build_children
from atom_operator.children.meta import APPLIED_HASH, DEPLOYMENT_LABEL
from atom_operator.ownership import repairs
from atom_operator.status import Observation, PodView, RoleState, compute, pending_message


def owner(**spec) -> Owner:
    return Owner("llm", "ns", "u", AtomDeploymentSpec.model_validate({"model": {"source": "builtin:tiny"}, **spec}))


def deployment() -> dict:
    return next(c for c in build_children(owner(), Defaults()).desired if c["kind"] == "Deployment")


def as_stored(obj: dict) -> dict:
    """Roughly what the API server returns: defaults added, quantities canonical."""
    out = copy.deepcopy(obj)
    out["metadata"].update(uid="x", resourceVersion="7", generation=1)
    out["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
    c = out["spec"]["template"]["spec"]["containers"][0]
    c["terminationMessagePath"] = "/dev/termination-log"
    c["readinessProbe"].update(timeoutSeconds=1, successThreshold=1)
    out["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirst"
    out["status"] = {"replicas": 1}
    return out


def test_an_object_as_stored_with_server_defaults_needs_no_write() -> None:
    desired = deployment()
    assert not needs_write(desired, as_stored(desired))


def test_a_hand_edited_field_needs_a_write() -> None:
    desired = deployment()
    current = as_stored(desired)
    current["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    assert needs_write(desired, current)


def test_a_removed_list_item_needs_a_write() -> None:
    desired = deployment()
    current = as_stored(desired)
    current["spec"]["template"]["spec"]["containers"][0]["ports"].pop()
    assert needs_write(desired, current)


def test_others_additions_outside_the_fields_we_own_whole_are_left_alone() -> None:
    desired = deployment()
    current = as_stored(desired)
    pod = current["spec"]["template"]["spec"]
    pod["containers"].append({"name": "sidecar", "image": "mesh:1", "env": [{"name": "A", "value": "1"}]})
    pod["volumes"].append({"name": "mesh-certs", "emptyDir": {}})
    current["metadata"]["labels"]["team"] = "search"
    current["metadata"]["annotations"]["other.example/note"] = "x"
    assert not needs_write(desired, current)


def test_an_env_var_added_to_the_engine_container_is_foreign_and_replaced_whole() -> None:
    desired = deployment()
    current = as_stored(desired)
    current["spec"]["template"]["spec"]["containers"].insert(0, {"name": "sidecar", "image": "mesh:1"})
    current["spec"]["template"]["spec"]["containers"][1]["env"].append({"name": "DEBUG", "value": "1"})
    assert needs_write(desired, current)
    ops = repairs(desired, current, contains)
    want = desired["spec"]["template"]["spec"]["containers"][0]["env"]
    assert ops == [
        {"op": "test", "path": "/spec/template/spec/containers/1/name", "value": "engine"},
        {"op": "replace", "path": "/spec/template/spec/containers/1/env", "value": want},
    ]


def test_a_selector_key_added_by_hand_needs_a_write_and_our_removed_label_too() -> None:
    service = next(c for c in build_children(owner(), Defaults()).desired if c["kind"] == "Service")
    current = copy.deepcopy(service)
    current["spec"]["selector"]["extra"] = "x"
    assert needs_write(service, current)
    assert repairs(service, current, contains) == [
        {"op": "replace", "path": "/spec/selector", "value": service["spec"]["selector"]}
    ]
    current = copy.deepcopy(service)
    del current["metadata"]["labels"][DEPLOYMENT_LABEL]
    assert needs_write(service, current) and repairs(service, current, contains) == []


def test_a_configmap_key_added_by_hand_is_removed() -> None:
    config = next(c for c in build_children(owner(), Defaults()).desired if c["kind"] == "ConfigMap")
    current = copy.deepcopy(config)
    current["data"]["extra.yaml"] = "lanes: 99\n"
    assert needs_write(config, current)
    assert repairs(config, current, contains)[-1]["path"] == "/data"


def test_a_spec_change_that_only_removes_a_field_needs_a_write_through_the_applied_hash() -> None:
    before = build_children(owner(decode={"tolerations": [{"key": "npu", "operator": "Exists"}]}), Defaults())
    after = build_children(owner(), Defaults())
    old, new = before.desired[-1], after.desired[-1]
    assert contains(as_stored(old)["spec"], new["spec"])  # the diff alone cannot see a removal ...
    assert needs_write(new, as_stored(old))  # ... the hash of what we applied can
    assert new["metadata"]["annotations"][APPLIED_HASH] != old["metadata"]["annotations"][APPLIED_HASH]


def test_quantities_compare_by_value() -> None:
    assert contains({"memory": "2Gi", "cpu": "1"}, {"memory": "2048Mi", "cpu": "1000m"})
    assert not contains({"memory": "2Gi"}, {"memory": "2G"})
    assert not contains("a", "b")


PENDING = (
    "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient rebellions.ai/npu."
    " preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)


def test_pending_pods_short_of_npus_are_reported_in_plain_words() -> None:
    o = owner(decode={"replicas": 3, "npusPerReplica": 4})
    pods = [PodView("decode", True, PENDING), PodView("decode", True, PENDING), PodView("decode", False, None)]
    assert (
        pending_message(o, "decode", pods)
        == "decode: 2 of 3 pods Pending: insufficient rebellions.ai/npu (each needs 4)"
    )
    assert pending_message(o, "prefill", pods) is None


def decode_only(generation: int, deployment: dict, applied_hash: str, replicas: int = 1) -> Observation:
    """A decode role (no prefill) whose Deployment is ``deployment``, applied from ``applied_hash``; no pods."""
    return Observation(generation, (RoleState("decode", replicas, deployment, applied_hash),))


def test_status_is_ready_only_when_every_role_rolled_out_and_keeps_transition_times() -> None:
    o = owner()
    desired = deployment()
    h = desired["metadata"]["annotations"][APPLIED_HASH]
    dep = as_stored(desired)
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1}
    first = compute(o, decode_only(3, dep, h), None, "T1")
    cond = {c["type"]: c for c in first["conditions"]}
    assert (cond["Ready"]["status"], cond["Progressing"]["status"], cond["Degraded"]["status"]) == (
        "False",
        "True",
        "False",
    )
    assert first["decode"] == {"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1, "summary": "0/1"}
    assert first["endpoint"] == "http://llm.ns.svc:8000/v1"
    assert first["observedGeneration"] == 3
    dep["status"]["readyReplicas"] = 1
    second = compute(o, decode_only(3, dep, h), first, "T2")
    cond = {c["type"]: c for c in second["conditions"]}
    assert cond["Ready"]["status"] == "True" and cond["Ready"]["lastTransitionTime"] == "T2"
    assert cond["Degraded"]["lastTransitionTime"] == "T1"  # unchanged status keeps its time
    assert (
        second["selector"]
        == "app.kubernetes.io/component=decode,app.kubernetes.io/instance=llm,app.kubernetes.io/name=atom-engine"
    )
    assert compute(o, decode_only(3, dep, h), second, "T3") == second


def test_zero_decode_replicas_is_not_ready_scaled_to_zero_and_advertises_no_endpoint() -> None:
    o = owner(decode={"replicas": 0})
    desired = next(c for c in build_children(o, Defaults()).desired if c["kind"] == "Deployment")
    dep = as_stored(desired)
    dep["status"] = {"observedGeneration": 1}  # 0/0: rolled out, nothing to wait for
    h = desired["metadata"]["annotations"][APPLIED_HASH]
    out = compute(o, decode_only(1, dep, h, replicas=0), None, "T1")
    cond = {c["type"]: c for c in out["conditions"]}
    assert (cond["Ready"]["status"], cond["Ready"]["reason"]) == ("False", "ScaledToZero")
    assert cond["Progressing"]["status"] == "False"
    assert out["endpoint"] is None
    assert out["decode"]["summary"] == "0/0"
