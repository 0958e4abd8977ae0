"""The InferencePool, its endpoint picker and the optional HTTPRoute, built without any API server."""

from __future__ import annotations

import yaml
from atom_localcluster import gie
from atom_operator.api import AtomDeploymentSpec
from atom_operator.children.inferencepool import build_epp, build_http_route, build_inference_pool
from atom_operator.children.meta import Owner, selector_labels


def owner() -> Owner:
    spec = {"model": {"source": "builtin:tiny"}, "decode": {"replicas": 2}}
    return Owner("llm", "ns", "uid-1", AtomDeploymentSpec.model_validate(spec, strict=False))


def test_the_pool_selects_the_decode_pods_on_the_engine_port_and_fails_open_to_its_picker() -> None:
    pool = build_inference_pool(owner())
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert pool["spec"]["selector"] == {"matchLabels": selector_labels(owner(), "decode")}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"kind": "Service", "name": "llm-epp", "port": {"number": 9002},
                                                 "failureMode": "FailOpen"}
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_the_pool_is_valid_against_the_pinned_crds_schema() -> None:
    """Every field the operator sets is one the extension's v1 schema has, with an allowed value."""
    crd = yaml.safe_load(gie.pool_crd().read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def check(value: object, s: dict, where: str) -> None:
        if "enum" in s:
            assert value in s["enum"], where
        if isinstance(value, dict) and "properties" in s:
            assert set(s.get("required", [])) <= set(value), where
            for k, v in value.items():
                assert k in s["properties"], f"{where}.{k} is not in the CRD"
                check(v, s["properties"][k], f"{where}.{k}")
        if isinstance(value, list):
            for i, v in enumerate(value):
                check(v, s["items"], f"{where}[{i}]")

    check(build_inference_pool(owner())["spec"], schema, "spec")


def test_the_picker_reads_only_its_namespace_and_runs_restricted() -> None:
    sa, role, binding, deployment, service = build_epp(owner(), "example.invalid/epp:v1.5.0", "IfNotPresent")
    assert [o["kind"] for o in (sa, role, binding, deployment, service)] == [
        "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"]
    assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in role["rules"])
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llm-epp", "namespace": "ns"}]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llm-epp"
    args = pod["containers"][0]["args"]
    assert args[args.index("--pool-name") + 1] == "llm" and args[args.index("--pool-namespace") + 1] == "ns"
    assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert not all(labels.get(k) == v for k, v in selector_labels(owner(), "decode").items()), "not a decode pod"
    assert {p["port"] for p in service["spec"]["ports"]} >= {9002}


def test_the_route_sends_every_path_of_the_named_gateway_to_the_pool() -> None:
    route = build_http_route(owner(), "inference-gateway", "gateways")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "inference-gateway", "namespace": "gateways"}]
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llm"}]


def routed(**pool) -> Owner:
    spec = {"model": {"source": "builtin:tiny"}, "decode": {"replicas": 2},
            "routing": {"inferencePool": {"enabled": True, **pool}}}
    return Owner("llm", "ns", "uid-1", AtomDeploymentSpec.model_validate(spec, strict=False))


def kinds(o: Owner, served: set[str]) -> list[tuple[str, str]]:
    from atom_operator.children import Defaults, build_children

    return [(c["kind"], c["metadata"]["name"]) for c in build_children(o, Defaults(), served=served).desired]


def verdict(c) -> tuple[bool, str]:  # noqa: ANN001
    return c.ok, c.reason


def test_routing_is_off_by_default_and_then_neither_builds_nor_reports_anything() -> None:
    from atom_operator import routing

    assert not any(k in ("InferencePool", "HTTPRoute") for k, _ in kinds(owner(), {"InferencePool", "HTTPRoute"}))
    assert routing.condition(owner(), {"InferencePool"}) is None


def test_the_pool_and_its_picker_are_built_only_where_the_crd_is_served_and_the_service_stays() -> None:
    from atom_operator import routing

    assert ("InferencePool", "llm") not in kinds(routed(), set())
    missing = routing.condition(routed(), set())
    assert (missing.ok, missing.reason) == (False, "CRDNotInstalled")
    assert "inferencepools.inference.networking.k8s.io" in missing.message and "Service llm" in missing.message
    built = kinds(routed(), {"InferencePool"})
    assert {("InferencePool", "llm"), ("Deployment", "llm-epp"), ("Service", "llm-epp"), ("Service", "llm"),
            ("Role", "llm-epp"), ("RoleBinding", "llm-epp"), ("ServiceAccount", "llm-epp")} <= set(built)
    assert verdict(routing.condition(routed(), {"InferencePool"})) == (True, "PoolCreated")


def test_an_httproute_only_for_a_named_gateway_whose_crd_is_served() -> None:
    from atom_operator import routing

    gw = routed(gateway={"name": "inference-gateway"})
    assert ("HTTPRoute", "llm") not in kinds(routed(), {"InferencePool", "HTTPRoute"})
    assert ("HTTPRoute", "llm") not in kinds(gw, {"InferencePool"})
    assert verdict(routing.condition(gw, {"InferencePool"})) == (False, "CRDNotInstalled")
    assert ("HTTPRoute", "llm") in kinds(gw, {"InferencePool", "HTTPRoute"})
    assert verdict(routing.condition(gw, {"InferencePool", "HTTPRoute"})) == (True, "PoolCreated")


def removed(o: Owner, served: set[str], routed_before: bool) -> set[tuple[str, str]]:
    from atom_operator.children import Defaults, build_children

    return set(build_children(o, Defaults(), served=served, routed_before=routed_before).absent)


PICKER = {(kind, "llm-epp") for kind in ("Deployment", "Service", "ServiceAccount", "Role", "RoleBinding")}


def test_routing_turned_off_removes_the_pool_its_picker_and_the_route() -> None:
    assert {("InferencePool", "llm"), ("HTTPRoute", "llm")} | PICKER <= removed(owner(), set(), routed_before=True)


def test_never_routed_asks_for_no_routing_child_at_all() -> None:
    """Routing off and nothing reported on it: no lookups of kinds no watch covers, for every AtomDeployment."""
    assert not {r for r in removed(owner(), set(), routed_before=False) if r[0] in ("InferencePool", "HTTPRoute")
                or r in PICKER}


def test_a_route_no_longer_wanted_goes_and_the_pool_stays() -> None:
    gone = removed(routed(), {"InferencePool", "HTTPRoute"}, routed_before=True)
    assert ("HTTPRoute", "llm") in gone
    assert ("InferencePool", "llm") not in gone and not gone & PICKER


def test_the_picker_goes_when_its_pools_crd_does() -> None:
    assert PICKER <= removed(routed(), set(), routed_before=True)


def test_a_condition_waiting_for_a_crd_asks_for_a_recheck_and_others_do_not() -> None:
    from atom_operator import routing

    assert routing.waits_for_crd(routing.condition(routed(), set()))
    assert not routing.waits_for_crd(routing.condition(routed(), {"InferencePool"}))
    assert not routing.waits_for_crd(routing.condition(owner(), set()))


def test_the_default_picker_image_is_the_release_hack_tools_pins() -> None:
    """One release for the picker the tests run, the image `make docker-build` builds and what the operator and the
    chart deploy by default (hack/tools/epp/go.mod)."""
    from atom_localcluster import tools
    from atom_localcluster.images import builds
    from atom_operator.children import Defaults

    release = tools.toolset_of("epp").version
    values = yaml.safe_load((tools.REPO / "charts" / "atom-operator" / "values.yaml").read_text())
    assert Defaults().epp_image == f"{values['engine']['eppImage']['repository']}:{release}"
    assert values["engine"]["eppImage"]["tag"] == release
    assert builds.default_tag("epp") == f"atom-epp:{release}"
