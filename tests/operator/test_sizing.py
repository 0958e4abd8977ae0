"""Default engine resources: sized from the model's shape, overridden per resource by the user's."""

from __future__ import annotations

import pytest
from atom_operator import sizing
from atom_operator.api import AtomDeploymentSpec, engine_settings
from atom_operator.children import Defaults, Owner, build_children


def spec(**body) -> AtomDeploymentSpec:
    return AtomDeploymentSpec.model_validate({"model": {"source": "builtin:tiny"}, **body}, strict=False)


def container(s: AtomDeploymentSpec, role: str = "decode") -> dict:
    children = build_children(Owner("llm", "ns", "u", s), Defaults()).desired
    name = f"llm-{role}"
    deployment = next(c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"] == name)
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_every_builtin_model_has_a_shape() -> None:
    from atom_engine.model.builtin import BUILTIN_MODELS

    assert set(sizing.MODEL_SHAPES) == {m.source for m in BUILTIN_MODELS.values()}


SHAPE = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
         "tie_word_embeddings")  # fmt: skip


def test_the_tiny_shape_is_the_engines_own_and_the_parameter_count_exact() -> None:
    from atom_engine.model import loader
    from atom_engine.model.llama import LlamaForCausalLM

    ours = sizing.MODEL_SHAPES[loader.BUILTIN_TINY]
    for name in SHAPE:
        assert getattr(ours, name) == getattr(loader.TINY_CONFIG, name), name
    model = LlamaForCausalLM(loader.TINY_CONFIG, 64)
    assert sizing.parameters(ours) == sum(p.numel() for p in model.parameters())


def test_a_converted_builtin_shape_is_its_checkpoints_config() -> None:
    import json

    from atom_engine.model.builtin import BUILTIN_MODELS
    from atom_engine.model.config import ModelConfig

    converted = [m for m in BUILTIN_MODELS.values() if m.converted and m.is_ready()]
    if not converted:
        pytest.skip("no converted checkpoint here (make model)")
    for m in converted:
        cfg = ModelConfig.from_hf(json.loads((m.checkpoint_dir() / "config.json").read_text()))
        for name in SHAPE:
            assert getattr(sizing.MODEL_SHAPES[m.source], name) == getattr(cfg, name), (m.name, name)


def test_engine_pods_get_memory_from_weights_kv_and_runtime_and_cpu() -> None:
    s = spec(decode={"kvBlocks": 8, "lanes": 4}, model={"source": "builtin:tiny", "maxSeqLen": 512})
    cfg = sizing.MODEL_SHAPES["builtin:tiny"]
    width = sizing.DTYPE_BYTES[engine_settings(s, "decode", name="llm").dtype]
    assert width == 2  # bfloat16: the default dtype of a deployment on NPUs
    weights = sizing.parameters(cfg) * width
    kv = 8 * 512 * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * width
    request, limit = sizing.memory_bytes(s, "decode")
    assert request == weights + kv + sizing.RUNTIME_BYTES
    assert limit == request + sizing.parameters(cfg) * 4  # room for a float32 copy while loading
    resources = container(s)["resources"]
    assert resources["requests"]["memory"] == f"{-(-request // sizing.MiB)}Mi"
    assert resources["requests"]["cpu"] == sizing.CPU_REQUEST["atom"]
    assert resources["limits"]["memory"] == f"{-(-limit // sizing.MiB)}Mi"
    assert "cpu" not in resources["limits"]


def test_more_kv_blocks_need_more_memory() -> None:
    small, _ = sizing.memory_bytes(spec(decode={"kvBlocks": 8}), "decode")
    large, _ = sizing.memory_bytes(spec(decode={"kvBlocks": 64}), "decode")
    assert large > small


def test_a_checkpoint_path_the_operator_cannot_read_gets_the_documented_default() -> None:
    request, limit = sizing.memory_bytes(spec(model={"source": "/models/llama"}), "decode")
    assert request == sizing.UNKNOWN_MODEL_MEMORY and limit > request


def test_the_users_resources_win_per_resource() -> None:
    s = spec(decode={"resources": {"requests": {"memory": "64Gi"}}})
    resources = container(s)["resources"]
    assert resources["requests"]["memory"] == "64Gi"
    assert "memory" not in resources.get("limits", {})  # our smaller default limit would contradict the request
    assert resources["requests"]["cpu"] == sizing.CPU_REQUEST["atom"]  # cpu was not named: still defaulted
    s = spec(decode={"resources": {"limits": {"cpu": "8"}}})
    resources = container(s)["resources"]
    assert resources["limits"]["cpu"] == "8" and "cpu" not in resources["requests"]
    assert "memory" in resources["requests"]


def test_no_engine_pod_is_best_effort() -> None:
    pd = spec(
        decode={"replicas": 1, "lanes": 1, "kvBlocks": 3, "localPrefill": False},
        prefill={"replicas": 1, "backend": "rngd", "prefetchNext": True},
    )
    for role in ("decode", "prefill"):
        requests = container(pd, role)["resources"]["requests"]
        assert {"cpu", "memory"} <= set(requests)
