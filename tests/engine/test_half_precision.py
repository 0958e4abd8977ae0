"""Half precision (what ATOM runs): the atom backend on the fake SDK against Hugging Face in the same dtype.

Rounding differs between any two half-precision implementations, so greedy tokens may part at a near-tie; a
divergence is accepted only where HF's own top-2 logit gap is within a few units of the dtype's resolution, and
every prompt's first-step logits must be about as accurate as HF's in that dtype: their distance from the
float32 logits at most twice HF's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings

from tests.engine.test_hf_exact import CHECKPOINTS, NEW_TOKENS, hf_generate, prompts


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama-half")
    CHECKPOINTS["llama"]().save_pretrained(path)
    return path


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_atom_half_precision_follows_hf_in_the_same_dtype(rebel, llama: Path, dtype: str) -> None:  # noqa: ANN001
    model = transformers.LlamaForCausalLM.from_pretrained(llama).eval()  # float32, as saved
    with torch.no_grad():
        exact32 = [model(torch.tensor([p])).logits[0, -1] for p in prompts()]
    half = model.to(getattr(torch, dtype))
    engine = LLMEngine(EngineSettings(backend="atom", model_source=str(llama), dtype=dtype, lanes=4, kv_blocks=6,
                                      max_seq_len=128, prefill_chunk=64, prefix_cache=True))
    assert engine.model.dtype == getattr(torch, dtype)
    got = [o.token_ids for o in engine.generate(prompts(), SamplingParams(max_tokens=NEW_TOKENS))]
    resolution = torch.finfo(getattr(torch, dtype)).eps
    exact = 0
    for i, p in enumerate(prompts()):
        ref = hf_generate(half, p)
        with torch.no_grad():
            first = half(torch.tensor([p])).logits[0, -1].float()
        # Block 1 after generate() ended: a free or cached block no later request reads.
        ours = engine.runner.prefill_logits(1, 0, p).float() if len(p) <= 64 else None
        if ours is not None:
            hf_error = float((first - exact32[i]).abs().max())
            our_error = float((ours - exact32[i]).abs().max())
            assert our_error <= 2 * hf_error, f"prompt {i}: off float32 by {our_error:.3e}, HF by {hf_error:.3e}"
        if got[i] == ref:
            exact += 1
            continue
        step = next(k for k, (a, b) in enumerate(zip(got[i], ref, strict=True)) if a != b)
        with torch.no_grad():
            logits = half(torch.tensor([p + ref[:step]])).logits[0, -1].float()
        top = torch.topk(logits, 2).values
        gap = float(top[0] - top[1])
        print(f"{dtype} prompt {i}: diverges at step {step}; HF top-2 gap {gap:.3e}")
        assert gap <= 4 * resolution * float(logits.abs().max()), f"prompt {i}: a clear gap {gap:.3e} diverged"
    assert exact >= len(prompts()) // 2, f"only {exact} of {len(prompts())} prompts match HF exactly"
