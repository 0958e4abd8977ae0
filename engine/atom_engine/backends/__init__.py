"""Backends run prefill, decode and block copy on a device.

``cpu`` runs the model eagerly with torch, free of static shapes; ``atom`` compiles the three static-shape graphs
with the RBLN SDK (``rebel``), imported only here.
"""

from __future__ import annotations

from typing import Protocol

import torch

from atom_engine.model.llama import LlamaForCausalLM


class Backend(Protocol):
    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
                logits_index: torch.Tensor) -> torch.Tensor: ...

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
               logits_index: torch.Tensor) -> torch.Tensor: ...

    def copy_block(self, src: int, dst: int) -> None: ...


def make_backend(name: str, model: LlamaForCausalLM, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                 lanes: int, chunk: int) -> Backend:
    if name == "cpu":
        from atom_engine.backends.cpu import CpuBackend

        return CpuBackend(model, k_cache, v_cache)
    if name == "atom":
        from atom_engine.backends.atom import AtomBackend

        return AtomBackend(model, k_cache, v_cache, lanes=lanes, chunk=chunk)
    raise ValueError(f"backend must be 'cpu' or 'atom'; got {name!r}")
