"""The cpu backend: the graphs run eagerly with torch."""

from __future__ import annotations

import torch

from atom_engine.backends.graphs import CopyBlockGraph, ForwardGraph
from atom_engine.model.llama import LlamaForCausalLM


class CpuBackend:
    def __init__(self, model: LlamaForCausalLM, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.forward = ForwardGraph(model)
        self.copy = CopyBlockGraph()
        self.k_cache, self.v_cache = k_cache, v_cache

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
                logits_index: torch.Tensor) -> torch.Tensor:
        return self.forward(ids, positions, slots, blocks, logits_index, self.k_cache, self.v_cache)

    decode = prefill  # same graph, other shapes; eager torch needs no separate compile

    def copy_block(self, src: int, dst: int) -> None:
        self.copy(torch.tensor([src]), torch.tensor([dst]), self.k_cache, self.v_cache)
