"""Default CPU and memory of an engine container, so engine pods are never BestEffort.

Without requests a pod holding gigabytes of weights is placed without memory accounting and is the first the
kubelet evicts under pressure. The defaults:

- memory request = weights + KV cache + runtime, where
    weights = the model's parameter count x the bytes of the role's dtype,
    KV      = kvBlocks x maxSeqLen x layers x 2 (K and V) x kvHeads x headDim x the same bytes (the settings the
              role's pods run with, so prefill workers count their own two blocks),
    runtime = RUNTIME_BYTES (Python, torch, the server, the NPU runtime's host side);
  the model's shape comes from :data:`MODEL_SHAPES` for a builtin model; a checkpoint path lives on a volume the
  operator cannot read, so its request is :data:`UNKNOWN_MODEL_MEMORY`, which the user's ``resources`` should
  replace with the model's real size.
- memory limit = the request + the weights once more, at 4 bytes a parameter: loading holds a second copy for a
  moment (a checkpoint stored in float32 is read, then converted to the role's dtype or uploaded to the NPU).
  The engine's measured peaks stay under it (benchmarks/results/measured-in-place.md).
- CPU request: :data:`CPU_REQUEST` per backend (the cpu backend computes on it; an NPU backend only feeds the
  device). No CPU limit: throttling a serving process only adds latency.

The user's ``resources`` win per resource: naming ``memory`` (as a request or a limit) replaces both memory
defaults, so a user's request can never exceed a default limit.
"""

from __future__ import annotations

from typing import Any

from atom_engine.dtypes import DTYPE_BYTES
from atom_engine.model.config import ModelConfig

from atom_operator.api import AtomDeploymentSpec, engine_settings
from atom_operator.children.meta import WorkloadRole

MiB = 1024**2
GiB = 1024**3
RUNTIME_BYTES = 1 * GiB
UNKNOWN_MODEL_MEMORY = 16 * GiB
CPU_REQUEST = {"cpu": "2", "atom": "1", "rngd": "1"}

# The shapes of the builtin models (torch-free here: the operator image has no torch). tests/operator/test_sizing
# checks each against the engine's own definition, so they cannot drift apart.
MODEL_SHAPES: dict[str, ModelConfig] = {
    "builtin:tiny": ModelConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    ),  # fmt: skip
    # SmolLM2-135M-Instruct's config.json (make model's converted checkpoint).
    "builtin:smollm2-135m": ModelConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
        head_dim=64, tie_word_embeddings=True,
    ),  # fmt: skip
}


def parameters(cfg: ModelConfig) -> int:
    """Parameters of a Llama-family model (embedding, per layer attention + MLP + two norms, final norm, head)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    attention = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size
    mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    layer = attention + mlp + 2 * cfg.hidden_size
    embedding = cfg.vocab_size * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else embedding
    return embedding + cfg.num_layers * layer + cfg.hidden_size + head


def memory_bytes(spec: AtomDeploymentSpec, role: WorkloadRole) -> tuple[int, int]:
    """(request, limit) in bytes for one ``role`` pod."""
    cfg = MODEL_SHAPES.get(spec.model.source)
    if cfg is None:
        return UNKNOWN_MODEL_MEMORY, UNKNOWN_MODEL_MEMORY + UNKNOWN_MODEL_MEMORY // 2
    settings = engine_settings(spec, role, name="sizing", prefill_workers="sizing:0")
    width = DTYPE_BYTES[settings.dtype]
    weights = parameters(cfg) * width
    kv = settings.kv_blocks * settings.max_seq_len * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * width
    request = weights + kv + RUNTIME_BYTES
    return request, request + parameters(cfg) * DTYPE_BYTES["float32"]


def _mi(n: int) -> str:
    return f"{-(-n // MiB)}Mi"  # rounded up to whole MiB


def default_resources(spec: AtomDeploymentSpec, role: WorkloadRole) -> dict[str, dict[str, str]]:
    backend = spec.decode.backend if role == "decode" else spec.prefill.backend
    request, limit = memory_bytes(spec, role)
    return {
        "requests": {"cpu": CPU_REQUEST.get(backend, "1"), "memory": _mi(request)},
        "limits": {"memory": _mi(limit)},
    }


def with_defaults(user: dict[str, Any], defaults: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """``user``'s requests and limits, plus each default for a resource the user names in neither."""
    named = {r for part in user.values() for r in part}
    out = {part: dict(values) for part, values in user.items()}
    for part, values in defaults.items():
        for resource, quantity in values.items():
            if resource not in named:
                out.setdefault(part, {})[resource] = quantity
    return out
