"""The table on the real kube-apiserver: with the CRD alone (schema + CEL), and through the operator's webhook."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from atom_operator.api import AtomDeploymentSpec

from tests.api.cases import INVALID, VALID, Case, spec
from tests.api.probe import PROBE_GROUP, PROBE_KIND, PROBE_PLURAL

pytestmark = pytest.mark.cluster
REAL = "serving.atom.dev/v1alpha1"
PROBE = f"{PROBE_GROUP}/v1alpha1"


def _apply(cluster, manifest: dict):
    # JSON, so values such as 2.5 or "4" reach the server exactly as written.
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)


def _exists(cluster, namespace: str, name: str, resource: str = "atomdeployments.serving.atom.dev") -> bool:
    out = cluster.kubectl("get", resource, name, "-n", namespace, "--ignore-not-found", "-o", "name", check=False)
    return bool(out.stdout.strip())


def _manifest(case: Case, api_version: str, namespace: str) -> dict:
    return case.manifest(api_version, namespace, PROBE_KIND if api_version == PROBE else "AtomDeployment")


def _assert_refused(cluster, case: Case, namespace: str, api_version: str, resource: str) -> str:
    out = _apply(cluster, _manifest(case, api_version, namespace))
    assert out.returncode != 0, out.stdout
    for expected in case.expect:
        assert expected in out.stderr
    assert not _exists(cluster, namespace, case.object_name, resource)
    return out.stderr


def _assert_accepted(cluster, case: Case, namespace: str, api_version: str, resource: str) -> None:
    out = _apply(cluster, _manifest(case, api_version, namespace))
    assert out.returncode == 0, out.stderr
    assert _exists(cluster, namespace, case.object_name, resource)
    cluster.kubectl("delete", resource, case.object_name, "-n", namespace, "--wait=false")


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_crd_alone_refuses(crds, crd_ns: str, case: Case) -> None:
    _assert_refused(crds, case, crd_ns, REAL, "atomdeployments.serving.atom.dev")


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.id)
def test_crd_alone_accepts(crds, crd_ns: str, case: Case) -> None:
    _assert_accepted(crds, case, crd_ns, REAL, "atomdeployments.serving.atom.dev")


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_webhook_alone_refuses(crds, hook_ns: str, case: Case) -> None:
    # The probe CRD has no schema: the refusal can only be the webhook's.
    stderr = _assert_refused(crds, case, hook_ns, PROBE, f"{PROBE_PLURAL}.{PROBE_GROUP}")
    assert "denied the request" in stderr


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.id)
def test_webhook_alone_accepts(crds, hook_ns: str, case: Case) -> None:
    _assert_accepted(crds, case, hook_ns, PROBE, f"{PROBE_PLURAL}.{PROBE_GROUP}")


@pytest.mark.parametrize("case", INVALID + VALID, ids=lambda c: c.id)
def test_crd_with_webhook_judges_the_same(crds, hook_ns: str, case: Case) -> None:
    if case.valid:
        _assert_accepted(crds, case, hook_ns, REAL, "atomdeployments.serving.atom.dev")
    else:
        _assert_refused(crds, case, hook_ns, REAL, "atomdeployments.serving.atom.dev")


def test_defaults_come_back_complete(crds, crd_ns: str) -> None:
    case = Case("defaults", spec())
    assert _apply(crds, case.manifest(REAL, crd_ns)).returncode == 0
    stored = crds.get("atomdeployment", "defaults", "-n", crd_ns)["spec"]
    assert stored == AtomDeploymentSpec.model_validate(case.spec).model_dump(by_alias=True, exclude_none=True)
    assert stored["decode"]["kvBlocks"] == 8 and stored["prefill"]["replicas"] == 0


@pytest.mark.parametrize("namespace_fixture", ["crd_ns", "hook_ns"])
def test_an_update_cannot_make_an_object_invalid(crds, namespace_fixture: str, request) -> None:
    namespace = request.getfixturevalue(namespace_fixture)
    name = "update-me"
    ok = Case(name, spec({"lanes": 4, "kvBlocks": 6})).manifest(REAL, namespace)
    assert _apply(crds, ok).returncode == 0
    broken = Case(name, spec({"lanes": 5, "kvBlocks": 6})).manifest(REAL, namespace)
    out = _apply(crds, broken)
    assert out.returncode != 0 and "decode.kvBlocks must be >= decode.lanes + 2 = 7" in out.stderr
    assert crds.get("atomdeployment", name, "-n", namespace)["spec"]["decode"]["lanes"] == 4
    # Through the webhook alone too (the probe CRD has no rules of its own).
    if namespace_fixture == "hook_ns":
        assert _apply(crds, _manifest(Case(name, spec({"lanes": 4, "kvBlocks": 6})), PROBE, namespace)).returncode == 0
        out = _apply(crds, _manifest(Case(name, spec({"lanes": 5, "kvBlocks": 6})), PROBE, namespace))
        assert out.returncode != 0 and "denied the request" in out.stderr and "= 7" in out.stderr


def test_kubectl_explain_prints_field_descriptions(crds) -> None:
    out = crds.kubectl("explain", "atomdeployment.spec.decode.kvBlocks").stdout
    assert "KV-cache blocks compiled in" in out and "lanes + 2" in out


def test_kubectl_get_shows_the_printer_columns(crds, crd_ns: str, operator_process) -> None:
    # The session's operator writes the status the columns show; wait for it rather than faking it.
    case = Case("columns", spec({"replicas": 2, "npusPerReplica": 1, "lanes": 2, "kvBlocks": 5}))
    assert _apply(crds, case.manifest(REAL, crd_ns)).returncode == 0
    deadline = time.monotonic() + 120
    while True:
        lines = crds.kubectl("get", "atomdeployments", "-n", crd_ns, "--field-selector=metadata.name=columns").stdout
        if " True " in lines or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    header, row = lines.splitlines()[:2]
    assert header.split() == ["NAME", "READY", "DECODE", "PREFILL", "LANES", "KVBLOCKS", "ARTIFACT", "ENDPOINT", "AGE"]
    assert row.split()[:7] == ["columns", "True", "2/2", "0/0", "2", "5", f"http://columns.{crd_ns}.svc:8000/v1"]
    assert not row[header.index("ARTIFACT") : header.index("ENDPOINT")].strip()  # no compile cache, nothing to show


def test_scale_subresource_scales_decode(crds, crd_ns: str) -> None:
    assert _apply(crds, Case("scaled", spec()).manifest(REAL, crd_ns)).returncode == 0
    crds.kubectl("scale", "atomdeployment/scaled", "-n", crd_ns, "--replicas=3")
    assert crds.get("atomdeployment", "scaled", "-n", crd_ns)["spec"]["decode"]["replicas"] == 3


def test_webhook_warns_when_the_cluster_lacks_npus(crds, hook_ns: str) -> None:
    nodes = crds.get("nodes")["items"]
    have = sum(int(n["status"].get("allocatable", {}).get("rebellions.ai/npu", 0)) for n in nodes)
    need = have + 4
    manifest = Case("too-big", spec({"replicas": need // 4, "npusPerReplica": 4})).manifest(REAL, hook_ns)
    out = _apply(crds, manifest)
    assert out.returncode == 0, out.stderr
    assert f"Warning: needs {need} rebellions.ai/npu, cluster has {have} allocatable" in out.stderr
    legacy = sum(int(n["status"].get("allocatable", {}).get("rebellions.ai/ATOM", 0)) for n in nodes)
    if legacy:  # the harness's legacy-named node: the warning names the scheme the cluster also advertises
        assert f"the nodes advertise rebellions.ai/ATOM: {legacy}: if those are the NPUs meant" in out.stderr


def test_webhook_warns_about_a_missing_claim(crds, hook_ns: str) -> None:
    volume = {"persistentVolumeClaim": {"claimName": "no-such-claim"}}
    manifest = Case("no-claim", spec(model={"source": "/models/x", "volume": volume})).manifest(REAL, hook_ns)
    out = _apply(crds, manifest)
    assert out.returncode == 0, out.stderr
    assert "PersistentVolumeClaim 'no-such-claim' does not exist" in out.stderr


@pytest.mark.parametrize("levels", [40, 3000])
def test_webhook_refuses_deeply_nested_values_that_the_schema_cannot_bound(crds, hook_ns: str, levels: int) -> None:
    # Written as text: Python's own json would give up on the deep case before the server sees it.
    name = f"deep-{levels}"
    placeholder = Case(name, spec({"affinity": {"x": "DEEP"}})).manifest(REAL, hook_ns)
    text = json.dumps(placeholder).replace('"DEEP"', '{"x": ' * levels + "{}" + "}" * levels)
    out = crds.kubectl("create", "-f", "-", input=text, check=False)
    assert out.returncode != 0
    assert "denied the request" in out.stderr and "nested at most" in out.stderr
    assert not _exists(crds, hook_ns, name)


def test_no_child_objects_exist_for_refused_deployments(crds, crd_ns: str, hook_ns: str) -> None:
    for namespace in (crd_ns, hook_ns):
        refused = {c.object_name for c in INVALID}
        out = crds.kubectl("get", "deployments,services,configmaps", "-n", namespace, "-o", "yaml").stdout
        for item in yaml.safe_load(out)["items"]:
            owner = item["metadata"].get("labels", {}).get("serving.atom.dev/deployment")
            assert owner not in refused
