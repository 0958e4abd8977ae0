"""Backends run prefill, decode, block copy and KV export/import on a device; each owns its KV cache.

``cpu`` runs the model eagerly with torch on host tensors; ``atom`` compiles the static-shape graphs with the RBLN
SDK (``rebel``, imported only there), and its KV lives on the device, reached through graphs only; ``rngd``
compiles the prefill graph with FuriosaAI's furiosa-torch for prefill workers, its KV read back by explicit copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from atom_engine import limits
from atom_engine.capabilities import Capabilities
from atom_engine.model.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from atom_engine.settings import EngineSettings


class Backend(Protocol):
    """A device's forwards and its KV cache. ``capabilities`` says which of the optional ones it has: ``verify``
    and ``mixed`` exist only where it declares them, and callers ask it, never the backend's attributes."""

    name: str
    capabilities: Capabilities

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


@dataclass(frozen=True)
class BuildArgs:
    lanes: int
    kv_blocks: int
    chunk: int
    num_devices: int = 1
    load_from: Path | None = None  # a directory of graphs saved by ``save`` (an artifact)
    rngd_pes: int | None = None


def _cpu(model: LlamaForCausalLM, a: BuildArgs) -> Backend:
    from atom_engine.backends.cpu import CpuBackend

    return CpuBackend(model, kv_blocks=a.kv_blocks)


def _atom(model: LlamaForCausalLM, a: BuildArgs) -> Backend:
    from atom_engine.backends.atom import AtomBackend

    return AtomBackend(model, kv_blocks=a.kv_blocks, lanes=a.lanes, chunk=a.chunk, num_devices=a.num_devices,
                       load_from=a.load_from)


def _rngd(model: LlamaForCausalLM, a: BuildArgs) -> Backend:  # prefill workers only (limits.role_backend_error)
    from atom_engine.backends.rngd import RngdBackend

    return RngdBackend(model, kv_blocks=a.kv_blocks, chunk=a.chunk, num_devices=a.num_devices, pes=a.rngd_pes,
                       load_from=a.load_from)


def _torch_sdk(_settings: EngineSettings) -> dict[str, Any]:
    return {"name": "torch", "version": torch.__version__}


def _rebel_sdk(_settings: EngineSettings) -> dict[str, Any]:
    from atom_engine.backends.atom import import_rebel

    return {"name": "rebel-compiler", "version": str(getattr(import_rebel(), "__version__", "unknown"))}


def _furiosa_sdk(settings: EngineSettings) -> dict[str, Any]:
    from atom_engine.backends.rngd import pe_fusion, sdk_identity

    return {**sdk_identity(), "peFusion": pe_fusion(settings.num_devices, settings.rngd_pes)}


@dataclass(frozen=True)
class BackendEntry:
    """One backend by name: how it is built, the SDK its compiled graphs are bound to (an artifact's identity),
    and whether it runs on the host (numDevices means nothing to it)."""

    build: Callable[[LlamaForCausalLM, BuildArgs], Backend]
    sdk: Callable[[EngineSettings], dict[str, Any]]
    on_host: bool = False


# The one place a backend is picked by name; limits.BACKEND_ROLES lists the same names (the settings and the spec
# admit no other), and tests/engine/test_backend_table.py holds the two together.
REGISTRY: dict[str, BackendEntry] = {
    "cpu": BackendEntry(_cpu, _torch_sdk, on_host=True),
    "atom": BackendEntry(_atom, _rebel_sdk),
    "rngd": BackendEntry(_rngd, _furiosa_sdk),
}


def backend_entry(name: str) -> BackendEntry:
    if name not in REGISTRY:
        raise ValueError(f"backend must be one of {', '.join(limits.BACKENDS)}; got {name!r}")
    return REGISTRY[name]


def make_backend(name: str, model: LlamaForCausalLM, *, lanes: int, kv_blocks: int, chunk: int,
                 num_devices: int = 1, load_from: Path | None = None, rngd_pes: int | None = None) -> Backend:
    """``load_from``: a directory of graphs saved by ``save`` (an artifact), loaded instead of compiling."""
    return backend_entry(name).build(model, BuildArgs(lanes, kv_blocks, chunk, num_devices, load_from, rngd_pes))
