"""The table through the pydantic models alone, the engine's own constructor, and the pure admission review."""

from __future__ import annotations

import json

import pytest
import yaml
from atom_engine import limits
from atom_engine.settings import EngineSettings
from atom_operator import admission
from atom_operator.api import AtomDeployment, AtomDeploymentSpec, engine_settings, problems
from atom_operator.api.crd import render
from atom_operator.api.spec import prefill_role
from atom_operator.npu import NpuProfile, npu_demand
from pydantic import ValidationError

from tests.api.cases import INVALID, VALID, Case, spec
from tests.generated import CRD_PATH

ENGINE_RULES = {r.id for r in limits.RULES if r.scope == "engine"}


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_model_refuses_invalid_spec_naming_field_and_bound(case: Case) -> None:
    with pytest.raises(ValidationError):
        AtomDeployment.model_validate(case.manifest())
    text = " | ".join(map(str, problems(case.manifest())))
    for expected in case.expect:
        assert expected in text


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.id)
def test_model_accepts_valid_spec(case: Case) -> None:
    assert problems(case.manifest()) == []
    AtomDeployment.model_validate(case.manifest())


def _engine_kwargs(case: Case) -> dict:
    """What an engine of this deployment would be constructed with, read from the raw spec (defaults: the model's)."""
    decode, prefill = case.spec.get("decode", {}), case.spec.get("prefill", {})
    return {
        "lanes": decode.get("lanes", EngineSettings.model_fields["lanes"].default),
        "kv_blocks": decode.get("kvBlocks", EngineSettings.model_fields["kv_blocks"].default),
        "prefix_cache": decode.get("prefixCache", True),
        "local_prefill": decode.get("localPrefill", True),
        "prefetch_next": prefill.get("prefetchNext", False),
        "prefill_workers": "prefill.ns.svc:8000" if prefill.get("replicas", 0) >= 1 else None,
    }


@pytest.mark.parametrize("case", [c for c in INVALID if c.engine], ids=lambda c: c.id)
def test_engine_constructor_refuses_with_the_same_message(case: Case) -> None:
    model_messages = [p.message for p in problems(case.manifest()) if not p.field.startswith("metadata")]
    with pytest.raises(ValueError) as refused:
        EngineSettings(**_engine_kwargs(case))
    for message in model_messages:
        assert message in str(refused.value)
    for expected in case.expect:
        if expected != "decode.kvBlocks":  # the field path is the cluster's; the engine names it in its message
            assert expected in str(refused.value)


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.id)
def test_engine_settings_of_valid_specs_construct_for_both_roles(case: Case) -> None:
    parsed = AtomDeploymentSpec.model_validate(case.spec)
    workers = "x-prefill.ns.svc:8000" if prefill_role(parsed) else None
    decode = engine_settings(parsed, "decode", name=case.object_name, prefill_workers=workers)
    assert (decode.lanes, decode.kv_blocks, decode.prefix_cache) == (
        parsed.decode.lanes,
        parsed.decode.kv_blocks,
        parsed.decode.prefix_cache,
    )
    assert decode.model_name == (parsed.model.name or case.object_name)
    assert EngineSettings.model_validate(yaml.safe_load(decode.dump())) == decode  # what the ConfigMap carries
    prefill = engine_settings(parsed, "prefill", name=case.object_name)
    assert prefill.backend == parsed.prefill.backend and prefill.local_prefill and not prefill.prefetch_next


def test_engine_scope_rules_are_the_ones_the_engine_checks() -> None:
    # The engine can check the block and prefill rules; NPU counts and the name only exist in the cluster.
    assert ENGINE_RULES == {
        "kv-blocks-with-prefix-cache",
        "kv-blocks",
        "prefetch-needs-one-lane",
        "prefetch-needs-prefill-worker",
        "prefetch-needs-remote-prefill",
        "remote-prefill-needs-worker",
    }


def test_decode_settings_need_the_prefill_address_when_workers_exist() -> None:
    parsed = AtomDeploymentSpec.model_validate(spec({"localPrefill": False}, {"replicas": 1}))
    with pytest.raises(ValueError, match="prefill_workers"):
        engine_settings(parsed, "decode", name="x")
    assert engine_settings(parsed, "decode", name="x", prefill_workers="x-prefill:8000").prefill_workers


def test_committed_crd_is_the_generated_one() -> None:
    assert CRD_PATH.read_text() == render(), "crds/ is stale: run make crds"


def test_defaults_fill_a_minimal_spec() -> None:
    parsed = AtomDeploymentSpec.model_validate({"model": {"source": "builtin:tiny"}})
    assert parsed.model_dump(by_alias=True, exclude_none=True) == {
        "model": {"source": "builtin:tiny", "maxSeqLen": 512},
        "decode": {
            "replicas": 1,
            "backend": "atom",
            "npusPerReplica": 1,
            "lanes": 4,
            "kvBlocks": 8,
            "prefixCache": True,
            "localPrefill": True,
            "remotePrefillMinTokens": 512,
            "speculativeTokens": 5,
        },
        "prefill": {"replicas": 0, "backend": "atom", "npusPerReplica": 1, "prefetchNext": False},
        "service": {"type": "ClusterIP", "port": 8000},
        "routing": {"inferencePool": {"enabled": False}},
    }


def _obj(spec_: dict, namespace: str = "ns") -> dict:
    return {"metadata": {"name": "llm", "namespace": namespace}, "spec": spec_}


def test_review_warns_when_the_cluster_lacks_npus() -> None:
    verdict = admission.review(
        _obj(spec({"replicas": 3, "npusPerReplica": 4})), allocatable={"rebellions.ai/npu": 8}, claims=set()
    )
    assert verdict.allowed
    assert verdict.warnings == [
        "needs 12 rebellions.ai/npu, cluster has 8 allocatable (decode 3 × 4); pods that do not fit stay Pending"
    ]


def test_review_counts_prefill_npus_of_their_own_family() -> None:
    s = spec({"replicas": 1}, {"replicas": 3, "backend": "rngd", "npusPerReplica": 1})
    verdict = admission.review(_obj(s), allocatable={"rebellions.ai/npu": 8, "furiosa.ai/rngd": 2})
    assert verdict.warnings == [
        "needs 3 furiosa.ai/rngd, cluster has 2 allocatable (prefill 3 × 1); pods that do not fit stay Pending"
    ]


def test_review_is_quiet_when_npus_suffice_or_are_unknown() -> None:
    s = spec({"replicas": 2, "npusPerReplica": 4})
    assert admission.review(_obj(s), allocatable={"rebellions.ai/npu": 8}).warnings == []
    assert admission.review(_obj(s), allocatable=None).warnings == []


def test_review_warns_about_a_missing_volume_claim() -> None:
    s = spec(model={"source": "/models/x", "volume": {"persistentVolumeClaim": {"claimName": "weights"}}})
    verdict = admission.review(_obj(s, "team-a"), claims={"other"})
    assert verdict.allowed
    assert verdict.warnings == [
        "spec.model.volume.persistentVolumeClaim.claimName: PersistentVolumeClaim 'weights' does not exist in"
        " namespace 'team-a'; pods stay Pending until it does"
    ]
    assert admission.review(_obj(s, "team-a"), claims={"weights"}).warnings == []


def test_review_of_an_update_that_leaves_the_spec_alone_has_no_warnings() -> None:
    obj = _obj(spec({"replicas": 3, "npusPerReplica": 4}))
    assert admission.review(obj, old=obj, allocatable={"rebellions.ai/npu": 0}).warnings == []


def test_review_refuses_an_update_that_breaks_a_rule() -> None:
    old = _obj(spec({"lanes": 4, "kvBlocks": 6}))
    verdict = admission.review(_obj(spec({"lanes": 5, "kvBlocks": 6})), old=old)
    assert verdict.refusals == [
        "spec.decode.kvBlocks: "
        + limits.violations(
            limits.EngineView(
                lanes=5, kv_blocks=6, prefix_cache=True, local_prefill=True, prefetch_next=False, prefill_replicas=0
            )
        )[0]
    ]


@pytest.mark.parametrize("levels", [33, 60, 5000, 200_000])
def test_review_refuses_deeply_nested_values_without_recursing(levels: int) -> None:
    affinity: dict = {}
    node = affinity
    for _ in range(levels):
        node["a"] = {}
        node = node["a"]
    verdict = admission.review(_obj(spec({"affinity": affinity})))
    assert not verdict.allowed
    assert any("nested at most" in r for r in verdict.refusals)


@pytest.mark.parametrize("obj", [None, [], "spec", 7, {"spec": None}, {"spec": []}, {"metadata": 3, "spec": {}}])
def test_review_refuses_malformed_objects_with_a_message(obj: object) -> None:
    verdict = admission.review(obj)
    assert not verdict.allowed and all(isinstance(r, str) and r for r in verdict.refusals)


def test_review_of_a_huge_value_is_a_refusal() -> None:
    huge = spec(model={"source": "/" + "x" * 3_000_000})
    verdict = admission.review(json.loads(json.dumps(_obj(huge))))
    assert verdict.refusals == [
        "spec.model.source: String should have at most 4096 characters; got a string of 3000001 characters"
    ]


def test_node_npus_reads_the_vendors_extended_resources_only() -> None:
    allocatable = {
        "cpu": "16",
        "rebellions.ai/ATOM": "4",
        "rebellions.ai/npu": "2",
        "furiosa.ai/rngd": "bad",
        "furiosa.ai/rngd-2core.12gb": "4",
        "example.com/gpu": "1",
    }
    assert admission.node_npus(allocatable) == {
        "rebellions.ai/ATOM": 4,
        "rebellions.ai/npu": 2,
        "furiosa.ai/rngd-2core.12gb": 4,
    }


def test_a_profile_naming_the_other_atom_scheme_gets_a_hint_with_the_advertised_name() -> None:
    # A legacy cluster (generic names off) and an operator left at the default profile: every pod would stay
    # Pending, and the warning says which name the nodes do advertise.
    verdict = admission.review(_obj(spec({"replicas": 1})), allocatable={"rebellions.ai/ATOM": 8})
    assert verdict.warnings == [
        "needs 1 rebellions.ai/npu, cluster has 0 allocatable (decode 1 × 1); pods that do not fit stay Pending;"
        " the nodes advertise rebellions.ai/ATOM: 8: if those are the NPUs meant, set the operator's NPU profile to"
        " that name (chart value npu.<backend>.resource)"
    ]
    legacy = NpuProfile(atom={"resource": "rebellions.ai/ATOM"})
    assert (
        admission.review(_obj(spec({"replicas": 1})), allocatable={"rebellions.ai/ATOM": 8}, profile=legacy).warnings
        == []
    )


def test_the_rngd_demand_is_counted_under_a_partitioned_name() -> None:
    profile = NpuProfile(rngd={"resource": "furiosa.ai/rngd-2core.12gb"})
    s = spec({"replicas": 1}, {"replicas": 6, "backend": "rngd", "npusPerReplica": 1})
    assert npu_demand(AtomDeploymentSpec.model_validate(s), profile) == {
        "rebellions.ai/npu": 1,
        "furiosa.ai/rngd-2core.12gb": 6,
    }
    verdict = admission.review(
        _obj(s), allocatable={"rebellions.ai/npu": 8, "furiosa.ai/rngd-2core.12gb": 4}, profile=profile
    )
    assert verdict.warnings == [
        "needs 6 furiosa.ai/rngd-2core.12gb, cluster has 4 allocatable (prefill 6 × 1); pods that do not fit stay"
        " Pending"
    ]


def test_two_partitions_of_an_rngd_card_for_one_pod_are_refused() -> None:
    # furiosa-torch fuses one device from one card's PEs; two partitions may sit on two cards (atom_operator.npu).
    profile = NpuProfile(rngd={"resource": "furiosa.ai/rngd-2core.12gb"})
    verdict = admission.review(_obj(spec({"replicas": 1}, {"replicas": 1, "backend": "rngd", "npusPerReplica": 2})),
                               profile=profile)
    assert not verdict.allowed
    assert verdict.refusals == [
        "spec.prefill.npusPerReplica: rngd pods request furiosa.ai/rngd-2core.12gb, a partition of an RNGD card:"
        " npusPerReplica must be 1 (the engine fuses one partition's cores into its device); got 2; for more PEs"
        " use a larger partition or whole cards (the operator's NPU profile, npu.rngd.resource)"
    ]
    # Whole cards fuse: two of them are one 16-PE device.
    whole_cards = spec({"replicas": 1}, {"replicas": 1, "backend": "rngd", "npusPerReplica": 2})
    assert admission.review(_obj(whole_cards)).allowed


@pytest.mark.parametrize(("decode", "prefill", "dtype", "want"), [
    ({"backend": "cpu", "npusPerReplica": 0}, None, None, "float32"),
    ({"backend": "atom", "npusPerReplica": 1}, None, None, "bfloat16"),
    ({"backend": "cpu", "npusPerReplica": 0}, {"replicas": 1, "backend": "rngd"}, None, "bfloat16"),
    ({"backend": "cpu", "npusPerReplica": 0}, {"replicas": 0, "backend": "rngd"}, None, "float32"),
    ({"backend": "atom", "npusPerReplica": 1}, None, "float16", "float16"),
    ({"backend": "atom", "npusPerReplica": 1}, None, "float32", "float32"),
])
def test_model_dtype_defaults_to_half_precision_on_npus_and_is_the_same_in_both_roles(
        decode: dict, prefill: dict | None, dtype: str | None, want: str) -> None:
    model = {"source": "builtin:tiny", **({"dtype": dtype} if dtype else {})}
    parsed = AtomDeploymentSpec.model_validate(spec(decode, prefill, model=model))
    workers = "x-prefill:8000" if parsed.prefill.replicas else None
    roles = [engine_settings(parsed, "decode", name="x", prefill_workers=workers),
             engine_settings(parsed, "prefill", name="x")]
    assert [s.dtype for s in roles] == [want, want]  # the KV crosses between the roles in this dtype
    assert f"dtype: {want}" in roles[0].dump()


def test_model_dtype_refuses_other_precisions() -> None:
    with pytest.raises(ValidationError, match="dtype"):
        AtomDeploymentSpec.model_validate(spec(model={"source": "builtin:tiny", "dtype": "float64"}))
