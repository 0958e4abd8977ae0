"""What every engine role runs on, built one way: the model and its tokenizer, the runner (which owns the backend
and so the KV cache) and the KV block table. The decode engine and the prefill worker both start from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from atom_engine.kv_blocks import KVBlocks
from atom_engine.settings import EngineSettings

if TYPE_CHECKING:
    from atom_engine.model.llama import LlamaForCausalLM
    from atom_engine.model.tokenizer import Tokenizer
    from atom_engine.runner import ModelRunner


@dataclass
class ModelStack:
    model: LlamaForCausalLM
    tokenizer: Tokenizer | None
    runner: ModelRunner
    kv: KVBlocks

    @classmethod
    def load(cls, settings: EngineSettings) -> ModelStack:
        """Load (or build) the model, then compile or load its graphs: slow, so callers run it off the event
        loop."""
        from atom_engine.model.loader import load_model
        from atom_engine.runner import ModelRunner

        model, tokenizer = load_model(settings.model_source, max_seq_len=settings.max_seq_len, dtype=settings.dtype,
                                      seed=settings.seed)
        return cls(model, tokenizer, ModelRunner(model, settings),
                   KVBlocks(settings.kv_blocks, prefix_cache=settings.prefix_cache))
