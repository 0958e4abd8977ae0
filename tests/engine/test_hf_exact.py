"""Greedy outputs are token-exact against Hugging Face transformers for Llama and Qwen2 checkpoints.

Checkpoints are small random models saved with ``save_pretrained`` (no download). If a mismatch traces to a
floating-point near-tie (the top-2 logit gap at the diverging step is tiny), the test shows the gap and repeats
that comparison in float64 instead of loosening it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB, NEW_TOKENS, NEAR_TIE = 128, 12, 1e-4
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
CHECKPOINTS = {
    # GQA (4 query heads, 2 KV heads), a non-default rope_theta, untied embeddings
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, rope_theta=500000.0)),
    # q/k/v biases, tied embeddings, saved in shards (model.safetensors.index.json)
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON, tie_word_embeddings=True)),
}


def prompts() -> list[list[int]]:
    """12 prompts of 1..70 tokens; three share a prefix and arrive after earlier requests finished."""
    g = torch.Generator().manual_seed(1)
    base = torch.randint(0, VOCAB, (40,), generator=g).tolist()
    other = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (1, 9, 33, 64, 70, 3, 12, 50, 21)]
    return [base[:5], *other[:3], base[:17], *other[3:6], base[:30], *other[6:]]


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    name = request.param
    torch.manual_seed(0)
    model = CHECKPOINTS[name]().eval()
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path, max_shard_size="100KB" if name == "qwen2" else "50MB")
    assert (path / "model.safetensors.index.json").exists() == (name == "qwen2")
    ref = [hf_generate(model, p) for p in prompts()]
    return name, path, model, ref


def hf_generate(model: transformers.PreTrainedModel, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                         min_new_tokens=NEW_TOKENS)
    return out[0, len(prompt):].tolist()


def engine_generate(path: Path, prefix_cache: bool, dtype: str = "float32", speculative_tokens: int = 2
                    ) -> tuple[LLMEngine, list[list[int]]]:
    lanes = 4
    e = LLMEngine(EngineSettings(model_source=str(path), lanes=lanes, kv_blocks=lanes + (2 if prefix_cache else 1),
                                 prefix_cache=prefix_cache, max_seq_len=128, prefill_chunk=16, dtype=dtype,
                                 speculative_tokens=speculative_tokens))
    outs = e.generate(prompts(), SamplingParams(max_tokens=NEW_TOKENS))
    e.kv.check_invariant()
    return e, [o.token_ids for o in outs]


def top2_gap(model: transformers.PreTrainedModel, context: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([context])).logits[0, -1]
    top = torch.topk(logits.double(), 2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("speculative_tokens", [0, 2], ids=["one-token-steps", "drafts"])
@pytest.mark.parametrize("prefix_cache", [True, False], ids=["prefix-cache", "no-cache"])
def test_greedy_outputs_equal_hf_generate(checkpoint, prefix_cache: bool, speculative_tokens: int) -> None:  # noqa: ANN001
    name, path, model, ref = checkpoint
    e, got = engine_generate(path, prefix_cache, speculative_tokens=speculative_tokens)
    if prefix_cache:
        # The shared prefixes were reused (with drafts requests end sooner, and one shared prompt may be admitted
        # before the one it shares with has ended).
        assert e.stats()["prefix_cache_hits"] >= (1 if speculative_tokens else 2)
    if speculative_tokens:
        assert e.stats()["draft_tokens"] > 0
    mismatched = [i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b]
    if not mismatched:
        return
    for i in mismatched:
        step = next(k for k, (a, b) in enumerate(zip(got[i], ref[i], strict=True)) if a != b)
        gap = top2_gap(model, prompts()[i] + ref[i][:step])
        print(f"{name} prompt {i}: diverges at step {step}; HF top-2 logit gap {gap:.3e}")
        assert gap < NEAR_TIE, f"prompt {i} diverges at step {step} with a clear top-2 gap {gap:.3e}: a real bug"
    model64 = model.double()
    try:
        _, got64 = engine_generate(path, prefix_cache, dtype="float64", speculative_tokens=speculative_tokens)
        assert got64 == [hf_generate(model64, p) for p in prompts()]
    finally:
        model.float()


def test_checkpoint_tokenizer_json_is_used(tmp_path: Path) -> None:
    torch.manual_seed(0)
    CHECKPOINTS["llama"]().save_pretrained(tmp_path)
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    e = LLMEngine(EngineSettings(model_source=str(tmp_path), lanes=1, kv_blocks=2, prefix_cache=False,
                                 max_seq_len=64))
    out = e.generate(["w5 w7 w9"], SamplingParams(max_tokens=4))[0]
    assert out.prompt_token_ids == [5, 7, 9]
    assert out.text == " ".join(f"w{t}" for t in out.token_ids)


def test_unsupported_checkpoints_are_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        LLMEngine(EngineSettings(model_source=str(tmp_path)))
    with pytest.raises(ValueError, match="neither a built-in model nor a directory with a config.json"):
        LLMEngine(EngineSettings(model_source=str(tmp_path / "missing")))
