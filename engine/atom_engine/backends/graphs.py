"""The static-shape graphs, as torch modules with tensor-only inputs (what a graph compiler traces).

The atom backend compiles all of them; the cpu backend runs the model eagerly and uses only the block copy."""

from __future__ import annotations

import torch
from torch import nn

from atom_engine.model.llama import LlamaForCausalLM


class ForwardGraph(nn.Module):
    """Prefill (``[1, chunk]``) or decode (``[lanes, 1]``): writes the tokens' KV, returns ``[B, vocab]`` logits."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_blocks: torch.Tensor,
                attn_blocks: torch.Tensor, logits_index: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions, slot_blocks, attn_blocks, logits_index, k_cache, v_cache)


class CopyBlockGraph(nn.Module):
    """Copies block ``src`` to block ``dst`` in every layer's K and V (a prefix-cache hit)."""

    def forward(
        self, src: torch.Tensor, dst: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        k_cache[:, dst] = k_cache[:, src]
        v_cache[:, dst] = v_cache[:, src]
        return dst
