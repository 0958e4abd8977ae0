"""The static-shape graphs, as torch modules with tensor-only inputs (what a graph compiler traces).

The atom backend compiles all of them; the cpu backend runs the model eagerly and uses only the block copy."""

from __future__ import annotations

import torch
from torch import nn

from atom_engine.model.llama import LlamaForCausalLM, StaticAttention


class ForwardGraph(nn.Module):
    """Prefill (``[1, chunk]``) or decode (``[lanes, 1]``): writes the tokens' KV, returns ``[B, vocab]`` logits."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_blocks: torch.Tensor,
                attn_blocks: torch.Tensor, logits_index: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions, slot_blocks, logits_index, k_cache, v_cache,
                          StaticAttention(k_cache, v_cache, attn_blocks, positions))


class CopyBlockGraph(nn.Module):
    """Copies block ``src`` to block ``dst`` in every layer's K and V (a prefix-cache hit)."""

    def forward(
        self, src: torch.Tensor, dst: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        k_cache[:, dst] = k_cache[:, src]
        v_cache[:, dst] = v_cache[:, src]
        return dst


class ExportKVGraph(nn.Module):
    """Reads ``positions`` (a fixed window) of block ``block`` out of every layer: ``[2, layers, kv_heads, window,
    head_dim]`` (K then V). A device backend ships what its device computed through this explicit copy."""

    def forward(self, block: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        k = k_cache.index_select(1, block).squeeze(1).index_select(2, positions)
        v = v_cache.index_select(1, block).squeeze(1).index_select(2, positions)
        return torch.stack([k, v])


class ImportKVGraph(nn.Module):
    """Writes a window ``kv`` (``[2, layers, kv_heads, window, head_dim]``) at ``(slot_blocks[i], positions[i])``;
    the window's padding goes to the scratch block."""

    def forward(self, slot_blocks: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        k_cache[:, slot_blocks, :, positions] = kv[0].permute(2, 0, 1, 3)  # advanced indices first: [W, L, H, D]
        v_cache[:, slot_blocks, :, positions] = kv[1].permute(2, 0, 1, 3)
        return slot_blocks
