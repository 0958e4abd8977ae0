"""The rngd backend: prefill on FuriosaAI RNGD through the public furiosa-torch, for prefill workers only.

One graph, the prefill ``[1, chunk]`` in the compiler's form (:mod:`atom_engine.backends.rngd_graphs`), exported
with ``torch.export`` and compiled ahead of time by furiosa-torch's compiler (what
``CompileModule.from_module`` does, ``furiosa/torch/_module/runnable.py:209-245``); the compiled ``ir.Runnable``
is serialized into the compile cache (an artifact, :mod:`atom_engine.artifacts`) and deserialized by later starts.
The KV cache lives in device memory, one K and one V tensor per layer (as ``furiosa/torch/ext/transformers.py``
keeps it); the host reads a block's KV back only with an explicit ``.cpu()`` copy, and the prefill worker ships
that in the wire format. Decode runs on another backend (atom or cpu) in another pod.

Imported only by a prefill worker with ``backend: rngd``; it needs the rngd venv or image (furiosa-torch pins
torch 2.10, see requirements/rngd.in).
"""

from __future__ import annotations

import hashlib
import logging
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from atom_engine.backends.rngd_graphs import RngdForwardGraph, forward_example
from atom_engine.backends.rngd_runtime import PES_PER_RNGD, load_runtime
from atom_engine.capabilities import Capabilities
from atom_engine.model.llama import LlamaForCausalLM

log = logging.getLogger("atom_engine.rngd")

PREFILL_GRAPH = "prefill"
GRAPH_FILE = "prefill.runnable"  # ir.Runnable.serialize() bytes (furiosa/torch/_C/ir/__init__.pyi:307-323)
FUSIONS = (1, 2, 4, 8, 16, 32)  # PEs one device may fuse (furiosa/torch/_C/device/__init__.pyi:24)


def import_furiosa():  # noqa: ANN201 - the package ships only stubs
    try:
        import furiosa.torch
    except ImportError as exc:
        raise RuntimeError(
            "the rngd backend needs FuriosaAI's furiosa-torch (it pins torch 2.10): run it from the engine-rngd"
            " image or the rngd venv (bash hack/venv.sh rngd), or set backend: cpu"
        ) from exc
    return furiosa.torch


def sdk_identity() -> dict[str, str]:
    """The compiler's version and a hash of the graph's source (and torch's, which exports it): an artifact
    compiled from another form of the graph is another artifact. Read without importing furiosa.torch (slow)."""
    try:
        version = metadata.version("furiosa-torch")
    except metadata.PackageNotFoundError:
        version = "not installed"
    here = Path(__file__).resolve().parent
    h = hashlib.sha256(torch.__version__.encode())
    for source in (here / "rngd_graphs.py", here.parent / "model" / "llama.py"):
        h.update(source.read_bytes())
    return {"name": "furiosa-torch", "version": version, "graphs": h.hexdigest()[:16]}


def pe_fusion(num_devices: int, rngd_pes: int | None) -> int:
    """The PEs fused into the backend's one device: rngdPes when set (a partition of a card), else all 8 PEs of
    each of the numDevices cards."""
    if rngd_pes is not None:
        return rngd_pes
    pes = PES_PER_RNGD * num_devices
    if pes not in FUSIONS:
        raise ValueError(f"numDevices must be 1, 2 or 4 for the rngd backend (a device fuses {PES_PER_RNGD} PEs"
                         f" per RNGD, at most {FUSIONS[-1]}); got {num_devices}")
    return pes


def compile_uncached(ft: Any, exported: Any) -> Any:  # noqa: ANN401 - an ir.Runnable
    """furiosa-torch's compiler with its own cache in a private directory removed afterwards: that cache keeps a
    failed compile (under ~/.cache/furiosa/compiler by default) and replays the failure after the cause is fixed,
    and ``cache_context(None)`` does not turn it off (furiosa-torch 2026.4.0 keeps the default root_dir). The
    artifacts under compileCacheDir are the only cache."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="furiosa-compile-") as tmp, ft.config.cache_context(tmp):
        return ft.compiler.compile(exported)


class RngdBackend:
    name = "rngd"
    def __init__(self, model: LlamaForCausalLM, *, kv_blocks: int, chunk: int, num_devices: int = 1,
                 pes: int | None = None, load_from: Path | None = None, runtime: Any = None) -> None:  # noqa: ANN401
        ft = import_furiosa()
        self.rt = runtime if runtime is not None else load_runtime()
        pes = pe_fusion(num_devices, pes)
        # Readiness: is_available() is True without an NPU, so ask furiosa-smi what is there.
        found = self.rt.list_devices()
        if len(found) < num_devices:
            raise RuntimeError(f"the rngd backend needs {num_devices} RNGD (numDevices) but furiosa_smi.list_devices()"
                               f" finds {len(found)} {found}; is the furiosa.ai/rngd device given to this pod?")
        log.info("event=rngd_devices found=%s pes=%d runtime=%s", ",".join(found), pes, self.rt.name)
        # The compiled Runnable is bound to the fusion current when it compiles (expected_num_fusion), and a
        # process fixes its fusion once: set it before compiling, in furiosa-torch and in the runtime.
        ft.set_fusion(pes)
        self.rt.set_fusion(pes)
        self.num_layers = model.cfg.num_layers
        self.kv_shape = model.kv_shape(kv_blocks)[1:]  # per layer: [kv_blocks, kv_heads, max_seq_len, head_dim]
        example = forward_example(model, kv_blocks, chunk)
        self.input_info = [[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in example]
        with torch.no_grad():
            exported = torch.export.export(RngdForwardGraph(model).eval(), example, strict=False)
        program = exported.module()  # what the fake runtime executes; taken before the compiler's passes
        self.inner = self._compile_or_load(ft, exported, load_from)
        compiled = self._compile_module(exported)
        self.device = "furiosa:0"  # fused over all numDevices RNGD: one logical device
        # One compiled prefill graph (last-token logits); prefill workers never decode.
        self.capabilities = Capabilities(decode=False, devices=num_devices)
        self.module = self.rt.module(compiled, program).to(self.device)
        self.kv = [self.rt.zeros(self.kv_shape, model.dtype, self.device) for _ in range(2 * self.num_layers)]

    def _compile_or_load(self, ft: Any, exported: Any, load_from: Path | None) -> Any:  # noqa: ANN401
        from furiosa.torch import ir
        from furiosa.torch.export.exported_program import preprocess_exported_program

        # CompileModule.from_exported, split so that the Runnable can come from an artifact (runnable.py:209-225).
        self.preprocessed, self.reconstructor = preprocess_exported_program(exported)
        if load_from is not None:
            return ir.Runnable.deserialize((Path(load_from) / GRAPH_FILE).read_bytes())
        t0 = time.perf_counter()
        inner = compile_uncached(ft, self.preprocessed)
        self.compile_seconds = time.perf_counter() - t0
        log.info("event=rngd_compiled graph=%s seconds=%.1f", PREFILL_GRAPH, self.compile_seconds)
        return inner

    def _compile_module(self, exported: Any) -> Any:  # noqa: ANN401
        from furiosa.torch import CompileModule, Runnable
        from furiosa.torch.export import ExportedProgramWeight

        return CompileModule(Runnable(self.inner), ExportedProgramWeight(self.preprocessed), self.reconstructor)

    # -- artifacts ---------------------------------------------------------------------------------------------
    def graph_manifest(self) -> list[dict[str, Any]]:
        return [{"name": PREFILL_GRAPH, "file": GRAPH_FILE, "inputInfo": self.input_info,
                 "expectedNumFusion": self.inner.expected_num_fusion}]

    def save(self, directory: Path) -> None:
        (Path(directory) / GRAPH_FILE).write_bytes(self.inner.serialize())

    # -- the graphs --------------------------------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
                logits_index: torch.Tensor) -> torch.Tensor:
        inputs = [self.rt.to_device(t, self.device) for t in (ids, positions, slots, blocks, logits_index)]
        logits = self.module(*inputs, *self.kv)
        return logits.cpu()  # the explicit device -> host copy

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
               logits_index: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the rngd backend runs the prefill role only; decode runs on atom or cpu")

    def copy_block(self, src: int, dst: int) -> None:
        raise RuntimeError("the rngd backend runs prefill workers, which run without a prefix cache")

    # -- PD: KV in device memory, read back by explicit copies -----------------------------------------------
    def export_kv(self, block: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[layers, kv_heads, end - start, head_dim]`` host copies: a device-side slice of each layer's cache,
        then ``.cpu()`` (as ``furiosa/torch/ext/transformers.py:63-64`` reads KV back)."""
        k = torch.stack([self.kv[2 * i][block, :, start:end].cpu() for i in range(self.num_layers)])
        v = torch.stack([self.kv[2 * i + 1][block, :, start:end].cpu() for i in range(self.num_layers)])
        return k, v

    def import_kv(self, block: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[2]
        for i in range(self.num_layers):  # host -> device slices (transformers.py:71-72)
            self.kv[2 * i][block, :, start:end].copy_(k[i])
            self.kv[2 * i + 1][block, :, start:end].copy_(v[i])
