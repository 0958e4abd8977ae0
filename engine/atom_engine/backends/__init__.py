"""Backends run prefill, decode, block copy and KV export/import on a device; each owns its KV cache.

``cpu`` runs the model eagerly with torch on host tensors; ``atom`` compiles the static-shape graphs with the RBLN
SDK (``rebel``, imported only there), and its KV lives on the device, reached through graphs only; ``rngd``
compiles the prefill graph with FuriosaAI's furiosa-torch for prefill workers, its KV read back by explicit copies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from atom_engine import limits
from atom_engine.model.llama import LlamaForCausalLM


class Backend(Protocol):
    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
                logits_index: torch.Tensor) -> torch.Tensor: ...

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
               logits_index: torch.Tensor) -> torch.Tensor: ...

    def copy_block(self, src: int, dst: int) -> None: ...

    def export_kv(self, block: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Host tensors in the model dtype, each ``[layers, kv_heads, end - start, head_dim]``."""
        ...

    def import_kv(self, block: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None: ...

    def graph_manifest(self) -> list[dict[str, Any]]:
        """Each compiled graph's name, file and input_info (an artifact's manifest lists them)."""
        ...

    def save(self, directory: Path) -> None:
        """Write the compiled graphs into ``directory`` (nothing for a backend that does not compile)."""
        ...


def make_backend(name: str, model: LlamaForCausalLM, *, lanes: int, kv_blocks: int, chunk: int,
                 num_devices: int = 1, load_from: Path | None = None, rngd_pes: int | None = None) -> Backend:
    """``load_from``: a directory of graphs saved by ``save`` (an artifact), loaded instead of compiling."""
    if name == "cpu":
        from atom_engine.backends.cpu import CpuBackend

        return CpuBackend(model, kv_blocks=kv_blocks)
    if name == "atom":
        from atom_engine.backends.atom import AtomBackend

        return AtomBackend(model, kv_blocks=kv_blocks, lanes=lanes, chunk=chunk, num_devices=num_devices,
                           load_from=load_from)
    if name == "rngd":  # prefill workers only (limits.role_backend_error keeps it from decoding)
        from atom_engine.backends.rngd import RngdBackend

        return RngdBackend(model, kv_blocks=kv_blocks, chunk=chunk, num_devices=num_devices, pes=rngd_pes,
                           load_from=load_from)
    # limits.BACKEND_ROLES lists the names built above: the settings and the spec admit no other.
    raise ValueError(f"backend must be one of {', '.join(limits.BACKENDS)}; got {name!r}")
