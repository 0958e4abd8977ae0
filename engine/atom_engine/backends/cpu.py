"""The cpu backend: the graphs run eagerly with torch."""

from __future__ import annotations

import torch

from atom_engine.backends.graphs import CopyBlockGraph, ForwardGraph
from atom_engine.kv_blocks import SCRATCH_BLOCK
from atom_engine.model.llama import LlamaForCausalLM


class CpuBackend:
    def __init__(self, model: LlamaForCausalLM, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.forward = ForwardGraph(model)
        self.copy = CopyBlockGraph()
        self.k_cache, self.v_cache = k_cache, v_cache

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
                logits_index: torch.Tensor, kv_len: int) -> torch.Tensor:
        # Eager torch is not bound to static shapes: drop the chunk's trailing pad tokens and attend over the
        # positions in use only (views, no copies).
        n = int(logits_index[0]) + 1
        k, v = self.k_cache[:, :, :, :kv_len], self.v_cache[:, :, :, :kv_len]
        return self.forward(ids[:, :n], positions[:, :n], slots[:, :n], blocks, logits_index, k, v)

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
               logits_index: torch.Tensor, kv_len: int) -> torch.Tensor:
        k, v = self.k_cache[:, :, :, :kv_len], self.v_cache[:, :, :, :kv_len]
        active = (blocks != SCRATCH_BLOCK).nonzero().flatten()
        if len(active) == len(blocks):
            return self.forward(ids, positions, slots, blocks, logits_index, k, v)
        # Skip the empty lanes (an NPU graph pads them with the scratch block; eager torch need not).
        part = self.forward(ids[active], positions[active], slots[active], blocks[active], logits_index[active], k, v)
        logits = part.new_zeros(len(blocks), part.shape[-1])
        logits[active] = part
        return logits

    def copy_block(self, src: int, dst: int) -> None:
        self.copy(torch.tensor([src]), torch.tensor([dst]), self.k_cache, self.v_cache)
