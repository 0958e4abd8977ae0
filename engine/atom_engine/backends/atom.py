"""The atom backend: the model's static-shape graphs compiled and run with the RBLN SDK (``rebel``).

It keeps the contract of Rebellions' own packages (optimum-rbln / vllm-rbln 0.12.0):
- one ``CompileContext(use_weight_sharing=True)`` for every graph, the KV marked in it as static addresses with
  ``meta`` example tensors (optimum/rbln/transformers/models/decoderonly/modeling_decoderonly.py:262-334): the KV
  is device memory the runtimes share, and no host tensor holds it;
- a runtime call passes the non-static inputs only (decoderonly_runtime_utils.py:347-357, :631-642);
- ``Runtime(compiled, tensor_type="pt", device=int|list)`` with one device per ``num_devices``;
- ``compiled.save(path)`` / ``RBLNCompiledModel(path)`` for saved artifacts (modeling_base.py:190-213).
Graphs: prefill ``[1, chunk]`` (and a variant returning every token's logits, for prompt logprobs), decode
``[lanes, 1]``, block copy, and KV export/import over a window of ``chunk`` positions, so PD ships what the device
computed.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import torch

from atom_engine import limits
from atom_engine.backends.devices import check_fits, visible_devices
from atom_engine.backends.graphs import CopyBlockGraph, ExportKVGraph, ForwardGraph, ImportKVGraph
from atom_engine.capabilities import Capabilities
from atom_engine.dtypes import dtype_name
from atom_engine.kv_blocks import SCRATCH_BLOCK
from atom_engine.model.llama import LlamaForCausalLM

INDEX_DTYPE = "int64"
KV_NAMES = ("past_key_values_k", "past_key_values_v")  # optimum names its static KV inputs past_key_values_*
GRAPH_SUFFIX = ".rbln"

InputInfo = list[tuple[str, list[int], str]]


def import_rebel():  # noqa: ANN201 - the SDK module has no stubs
    try:
        import rebel
    except ImportError as exc:
        raise RuntimeError(
            "the atom backend needs the RBLN SDK (python package rebel-compiler), which is not installed here;"
            " install it from Rebellions' package index on a host with ATOM NPUs, or set backend: cpu"
        ) from exc
    return rebel


def num_devices_kwarg(rebel: Any) -> str:
    """``num_devices``, or ``tensor_parallel_size`` on compilers that predate it: probed from ``rebel.compile``'s
    signature as optimum does (optimum/rbln/utils/runtime_utils.py:25-37)."""
    try:
        params = inspect.signature(rebel.compile).parameters
    except (AttributeError, ValueError, TypeError):
        return "num_devices"
    return "num_devices" if "num_devices" in params else "tensor_parallel_size"


class AtomBackend:
    name = "atom"

    def __init__(self, model: LlamaForCausalLM, *, kv_blocks: int, lanes: int, chunk: int, num_devices: int = 1,
                 load_from: Path | None = None) -> None:
        if chunk <= 0 or chunk % limits.ATOM_PREFILL_CHUNK_MULTIPLE:
            raise ValueError(f"prefillChunk must be a positive multiple of {limits.ATOM_PREFILL_CHUNK_MULTIPLE} on"
                             f" the atom backend (the RBLN compiler's rule), and at most maxSeqLen; got {chunk}")
        rebel = import_rebel()
        self.rebel = rebel
        self.dtype = model.dtype
        self.kv_shape = model.kv_shape(kv_blocks)
        self.window = chunk
        self.max_seq_len = model.max_seq_len
        weight_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
        kv_bytes = 2 * math.prod(self.kv_shape) * torch.empty((), dtype=self.dtype).element_size()
        check_fits(weight_bytes, kv_bytes, num_devices)
        devices = visible_devices(num_devices)
        device: int | list[int] = devices[0] if num_devices == 1 else devices
        self.graphs = self._graph_specs(model, lanes, chunk)
        # The prefill_all graph takes logits_index [1, chunk]; the decode graph one token per lane, and prefill and
        # decode are separate graphs.
        self.capabilities = Capabilities(every_token_logits=True, devices=num_devices)
        if load_from is None:
            compiled = self._compile(num_devices)
        else:
            compiled = {name: rebel.RBLNCompiledModel(Path(load_from) / f"{name}{GRAPH_SUFFIX}")
                        for name in self.graphs}
        self.compiled = compiled
        # modeling_decoderonly.py:648-654: one runtime per graph, all on the same devices.
        runtimes = {name: rebel.Runtime(c, tensor_type="pt", device=device) for name, c in compiled.items()}
        self.prefill_rt, self.decode_rt, self.copy_rt = runtimes["prefill"], runtimes["decode"], runtimes["copy_block"]
        self.prefill_all_rt = runtimes["prefill_all"]
        self.export_rt, self.import_rt = runtimes["export_kv"], runtimes["import_kv"]

    def _graph_specs(self, model: LlamaForCausalLM, lanes: int, chunk: int
                     ) -> dict[str, tuple[torch.nn.Module, InputInfo]]:
        layers, _, kv_heads, _, head_dim = self.kv_shape
        dt = dtype_name(self.dtype)
        kv: InputInfo = [(name, list(self.kv_shape), dt) for name in KV_NAMES]

        def forward_inputs(b: int, t: int, logits: list[int] | None = None) -> InputInfo:
            return [("input_ids", [b, t], INDEX_DTYPE), ("positions", [b, t], INDEX_DTYPE),
                    ("slot_blocks", [b, t], INDEX_DTYPE), ("attn_blocks", [b], INDEX_DTYPE),
                    ("logits_index", logits or [b], INDEX_DTYPE), *kv]

        forward = ForwardGraph(model)
        w = self.window
        return {
            "prefill": (forward, forward_inputs(1, chunk)),
            "decode": (forward, forward_inputs(lanes, 1)),
            "copy_block": (CopyBlockGraph(), [("src", [1], INDEX_DTYPE), ("dst", [1], INDEX_DTYPE), *kv]),
            "export_kv": (ExportKVGraph(), [("block", [1], INDEX_DTYPE), ("positions", [w], INDEX_DTYPE), *kv]),
            "import_kv": (ImportKVGraph(), [("slot_blocks", [w], INDEX_DTYPE), ("positions", [w], INDEX_DTYPE),
                                            ("kv", [2, layers, kv_heads, w, head_dim], dt), *kv]),
            "prefill_all": (forward, forward_inputs(1, chunk, [1, chunk])),
        }

    def _compile(self, num_devices: int) -> dict[str, Any]:
        from rebel.compile_context import CompileContext  # the import path of modeling_decoderonly.py:22

        ctx = CompileContext(use_weight_sharing=True)
        static = {name: torch.empty(self.kv_shape, dtype=self.dtype, device="meta") for name in KV_NAMES}
        for name, tensor in static.items():
            ctx.mark_static_address(tensor, name)
        kwarg = num_devices_kwarg(self.rebel)
        compiled = {}
        for name, (module, info) in self.graphs.items():
            examples = [static[n] if n in static else torch.zeros(shape, dtype=getattr(torch, dt))
                        for n, shape, dt in info]
            compiled[name] = self.rebel.compile_from_torch(module.eval(), input_info=info, example_inputs=examples,
                                                           compile_context=ctx, **{kwarg: num_devices})
        return compiled

    # -- artifacts ---------------------------------------------------------------------------------------------
    def graph_manifest(self) -> list[dict[str, Any]]:
        return [{"name": name, "file": f"{name}{GRAPH_SUFFIX}", "inputInfo": [list(e) for e in info]}
                for name, (_, info) in self.graphs.items()]

    def save(self, directory: Path) -> None:
        for name, compiled in self.compiled.items():
            compiled.save(Path(directory) / f"{name}{GRAPH_SUFFIX}")

    # -- the graphs --------------------------------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
                logits_index: torch.Tensor) -> torch.Tensor:
        if logits_index.dim() == 1:
            return _first(self.prefill_rt(ids, positions, slots, blocks, logits_index))
        n = logits_index.shape[1]  # every token's logits: the whole chunk's, cut to the real tokens
        index = torch.arange(self.window)[None]
        return _first(self.prefill_all_rt(ids, positions, slots, blocks, index))[:, :n]

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
               logits_index: torch.Tensor) -> torch.Tensor:
        return _first(self.decode_rt(ids, positions, slots, blocks, logits_index))

    def copy_block(self, src: int, dst: int) -> None:
        self.copy_rt(torch.tensor([src]), torch.tensor([dst]))

    def export_kv(self, block: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        w, last = self.window, self.max_seq_len - 1
        parts = []
        for s in range(start, end, w):
            positions = torch.arange(s, s + w).clamp_(max=last)  # past the end: read anything valid, dropped below
            kv = _first(self.export_rt(torch.tensor([block]), positions))
            parts.append(kv[..., : min(w, end - s), :])
        kv = torch.cat(parts, dim=3) if parts else torch.zeros(2, *self._window_shape(0), dtype=self.dtype)
        return kv[0].contiguous(), kv[1].contiguous()

    def import_kv(self, block: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        w, n_all = self.window, k.shape[2]
        for s in range(0, n_all, w):
            n = min(w, n_all - s)
            slots = torch.full((w,), SCRATCH_BLOCK, dtype=torch.long)  # the window's padding lands in scratch
            slots[:n] = block
            positions = torch.arange(w)
            positions[:n] = torch.arange(start + s, start + s + n)
            kv = torch.zeros(2, *self._window_shape(w), dtype=self.dtype)
            kv[0, :, :, :n] = k[:, :, s : s + n]
            kv[1, :, :, :n] = v[:, :, s : s + n]
            self.import_rt(slots, positions, kv)

    def _window_shape(self, w: int) -> tuple[int, int, int, int]:
        layers, _, kv_heads, _, head_dim = self.kv_shape
        return layers, kv_heads, w, head_dim


def _first(out: object) -> torch.Tensor:
    # Runtimes return a tensor, or a list of them for multi-output graphs.
    return torch.as_tensor(out[0] if isinstance(out, (list, tuple)) else out)
