"""The cluster NPU profile: the vendors' names as defaults, a clear refusal of any other name, one source for all."""

from __future__ import annotations

import json

import pytest
from atom_engine.limits import role_backend_error
from atom_operator.api import AtomDeploymentSpec, engine_settings
from atom_operator.config import Settings
from atom_operator.npu import NpuProfile, npu_demand
from pydantic import ValidationError


def test_the_defaults_are_what_the_vendors_installers_give_a_cluster_today() -> None:
    p = NpuProfile()
    assert p.resource("atom") == "rebellions.ai/npu"  # RBLN device plugin v0.4.0+: useGenericResourceName on
    assert p.node_selector("atom") == {"rebellions.ai/npu.present": "true"}
    assert p.resource("rngd") == "furiosa.ai/rngd"
    assert p.node_selector("rngd") == {"furiosa.ai/npu.family": "rngd"}  # there is no furiosa.ai/npu.present
    assert p.resource("cpu") is None and p.node_selector("cpu") == {}


@pytest.mark.parametrize(
    "resource",
    ["rebellions.ai/npu", "rebellions.ai/ATOM", "rebellions.ai/npu-vf4"],
)
def test_every_atom_name_the_rbln_plugin_advertises_is_accepted(resource: str) -> None:
    assert NpuProfile.parse(json.dumps({"atom": {"resource": resource}})).resource("atom") == resource


@pytest.mark.parametrize(
    "resource",
    ["furiosa.ai/rngd", "furiosa.ai/rngd-1core.6gb", "furiosa.ai/rngd-2core.12gb", "furiosa.ai/rngd-4core.24gb"],
)
def test_every_rngd_name_the_furiosa_plugin_advertises_is_accepted(resource: str) -> None:
    assert NpuProfile.parse(json.dumps({"rngd": {"resource": resource}})).resource("rngd") == resource


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"atom": {"resource": "rebellions.ai/atom"}}, "ATOM_NPU_PROFILE.atom.resource: String should match pattern"),
        ({"rngd": {"resource": "furiosa.ai/rngd-3core.18gb"}}, "ATOM_NPU_PROFILE.rngd.resource:"),
        ({"rngd": {"nodeSelector": {"furiosa.ai/npu.family": "not a value"}}}, "ATOM_NPU_PROFILE.rngd.nodeSelector:"),
        ({"gpu": {}}, "ATOM_NPU_PROFILE.gpu: Extra inputs are not permitted"),
    ],
)
def test_a_wrong_profile_stops_the_operator_naming_the_field_and_the_value(profile: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        Settings.from_env({"ATOM_NPU_PROFILE": json.dumps(profile)})
    assert message in str(e.value)


def test_not_json_is_refused_with_the_settings_name() -> None:
    with pytest.raises(ValueError, match="ATOM_NPU_PROFILE: not JSON"):
        NpuProfile.parse("rebellions.ai/ATOM")


def test_the_operator_reads_its_profile_from_the_environment() -> None:
    legacy = {"atom": {"resource": "rebellions.ai/ATOM", "nodeSelector": {"rebellions.ai/npu.family": "ATOM"}}}
    npu = Settings.from_env({"ATOM_NPU_PROFILE": json.dumps(legacy)}).defaults.npu
    assert npu.resource("atom") == "rebellions.ai/ATOM" and npu.node_selector("atom") == {
        "rebellions.ai/npu.family": "ATOM"
    }
    assert npu.resource("rngd") == "furiosa.ai/rngd"  # the other backend keeps its default
    assert Settings.from_env({}).defaults.npu == NpuProfile()


def test_demand_is_counted_under_the_profiles_names() -> None:
    spec = AtomDeploymentSpec.model_validate(
        {
            "model": {"source": "builtin:tiny"},
            "decode": {"replicas": 2, "npusPerReplica": 4},
            "prefill": {"replicas": 3, "backend": "rngd", "npusPerReplica": 1},
        }
    )
    assert npu_demand(spec) == {"rebellions.ai/npu": 8, "furiosa.ai/rngd": 3}
    legacy = NpuProfile(atom={"resource": "rebellions.ai/ATOM"})
    assert npu_demand(spec, legacy) == {"rebellions.ai/ATOM": 8, "furiosa.ai/rngd": 3}


def test_rngd_is_admitted_only_where_the_engine_runs_it() -> None:
    base = {"model": {"source": "builtin:tiny"}}
    with pytest.raises(ValidationError, match="decode.backend"):
        AtomDeploymentSpec.model_validate({**base, "decode": {"backend": "rngd"}})
    spec = AtomDeploymentSpec.model_validate(
        {**base, "decode": {"localPrefill": False}, "prefill": {"replicas": 1, "backend": "rngd", "npusPerReplica": 2}}
    )
    # What the operator renders for the rngd pods is what the engine accepts for them: the prefill role, no prefix
    # cache (EngineSettings refuses rngd with one), the NPUs as numDevices.
    settings = engine_settings(spec, "prefill", name="llm")
    assert role_backend_error("prefill", settings.backend) is None and role_backend_error("decode", "rngd")
    assert (settings.prefix_cache, settings.num_devices) == (False, 2)
