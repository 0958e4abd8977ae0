"""Build the model from a built-in source (atom_engine.model.builtin: ``builtin:tiny`` is made here from a fixed
seed, the others are converted checkpoints) or a Hugging Face-layout directory."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from atom_engine.dtypes import torch_dtype
from atom_engine.model import builtin
from atom_engine.model.config import ModelConfig
from atom_engine.model.llama import LlamaForCausalLM
from atom_engine.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

BUILTIN_TINY = builtin.BUILTIN_MODELS["tiny"].source
TINY_CONFIG = ModelConfig(
    vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
    eos_token_id=ByteTokenizer.EOS, tie_word_embeddings=True,
)



def load_model(
    source: str, *, max_seq_len: int, dtype: str = "float32", seed: int = 0
) -> tuple[LlamaForCausalLM, Tokenizer | None]:
    """The model in eval mode and its tokenizer (None when a checkpoint ships no ``tokenizer.json``)."""
    if source == BUILTIN_TINY:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(TINY_CONFIG, max_seq_len)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.5)  # broad logits: random tokens, few near-ties
        return model.to(torch_dtype(dtype)).eval(), ByteTokenizer(TINY_CONFIG.vocab_size)
    path = builtin.checkpoint_path(source)
    assert path is not None, f"{source} is made in process but has no branch here"
    if not (path / "config.json").is_file():
        raise ValueError(f"modelSource {source!r} is neither a built-in model nor a directory with a config.json")
    hf_cfg = json.loads((path / "config.json").read_text())
    cfg = ModelConfig.from_hf(hf_cfg)
    eos = cfg.eos_token_id
    gen = path / "generation_config.json"
    if gen.is_file():
        gen_eos = json.loads(gen.read_text()).get("eos_token_id", eos)
        eos = gen_eos[0] if isinstance(gen_eos, list) else gen_eos
    model = LlamaForCausalLM(cfg, max_seq_len)
    state = _read_safetensors(path)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint {source} does not match a {cfg.model_type} model: missing {missing[:5]},"
                         f" unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    tok_file = path / "tokenizer.json"
    tokenizer = HFTokenizer(tok_file, eos) if tok_file.is_file() else None
    model = model.to(torch_dtype(dtype)).eval()
    model.cfg = _with_eos(cfg, eos)
    return model, tokenizer


def _with_eos(cfg: ModelConfig, eos: int | None) -> ModelConfig:
    from dataclasses import replace

    return replace(cfg, eos_token_id=eos)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {path}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(path / name)))
    return state
