"""A fake RBLN SDK (``rebel``) for tests: the calls the atom backend makes, with the real contract enforced.

``compile_from_torch`` records the graph's ``input_info`` (and the static-address tensors of its
``CompileContext``); a ``Runtime`` then refuses any call whose arity, shapes or dtypes differ from what was compiled,
whose static-address inputs are not the very tensors marked at compile time, or whose block / position indices
fall outside the compiled KV cache (``k_cache``: ``[layers, kv_blocks, kv_heads, max_seq_len, head_dim]``) — a real
NPU would fault or silently corrupt memory. Otherwise it runs the torch module on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__version__ = "0.0.0+fake"

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
           "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "bool": torch.bool}
BLOCK_INPUTS = ("slot_blocks", "attn_blocks", "src", "dst")
POSITION_INPUTS = ("positions",)

COMPILED: list[CompiledModel] = []  # every compile of this process, for tests to inspect


class RBLNRuntimeError(RuntimeError):
    pass


def _dtype(d: Any) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    if d not in _DTYPES:
        raise TypeError(f"unsupported dtype in input_info: {d!r}")
    return _DTYPES[d]


class CompileContext:
    def __init__(self, use_weight_sharing: bool = False, **kwargs: Any) -> None:
        self.use_weight_sharing = use_weight_sharing
        self.static: dict[str, torch.Tensor] = {}

    def mark_static_address(self, tensor: torch.Tensor, name: str | None = None) -> None:
        self.static[name or f"static_{len(self.static)}"] = tensor


@dataclass
class CompiledModel:
    module: torch.nn.Module
    input_info: list[tuple[str, tuple[int, ...], torch.dtype]]
    static: dict[str, torch.Tensor] = field(default_factory=dict)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: shape for name, shape, _ in self.input_info}

    def create_runtime(self, device: int = 0, tensor_type: str = "pt", **kwargs: Any) -> Runtime:
        return Runtime(self, tensor_type=tensor_type, device=device)

    def save(self, path: str) -> None:
        raise NotImplementedError("the fake rebel does not serialise compiled models")


def compile_from_torch(module: torch.nn.Module, input_info: list, example_inputs: list | None = None,
                       compile_context: CompileContext | None = None, **kwargs: Any) -> CompiledModel:
    info = []
    for entry in input_info:
        name, shape, dtype = entry
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ValueError(f"input {name!r}: static shapes only, positive ints; got {shape}")
        info.append((name, tuple(shape), _dtype(dtype)))
    names = [n for n, _, _ in info]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate input names: {names}")
    if example_inputs is not None:
        for (name, shape, dtype), t in zip(info, example_inputs, strict=True):
            if tuple(t.shape) != shape or t.dtype != dtype:
                got = f"{tuple(t.shape)} {t.dtype}"
                raise ValueError(f"example input {name!r} is {got}; input_info says {shape} {dtype}")
    static = dict(compile_context.static) if compile_context else {}
    unknown = set(static) - set(names)
    if unknown:
        raise ValueError(f"static-address tensors {sorted(unknown)} are not graph inputs")
    compiled = CompiledModel(module, info, static)
    COMPILED.append(compiled)
    return compiled


class Runtime:
    def __init__(self, compiled: CompiledModel, tensor_type: str = "pt", device: int = 0, **kwargs: Any) -> None:
        if tensor_type != "pt":
            raise NotImplementedError("the fake rebel runs torch tensors only (tensor_type='pt')")
        self.compiled = compiled
        self.device = device
        self.calls = 0

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        return self.run(*args)

    def run(self, *args: torch.Tensor) -> torch.Tensor:
        info = self.compiled.input_info
        if len(args) != len(info):
            raise RBLNRuntimeError(f"the compiled graph takes {len(info)} inputs; got {len(args)}")
        kv = self.compiled.static.get("k_cache")
        for (name, shape, dtype), t in zip(info, args, strict=True):
            if not isinstance(t, torch.Tensor):
                raise RBLNRuntimeError(f"input {name!r} must be a torch.Tensor; got {type(t).__name__}")
            if tuple(t.shape) != shape:
                raise RBLNRuntimeError(f"input {name!r} has shape {tuple(t.shape)}; the graph was compiled for {shape}")
            if t.dtype != dtype:
                raise RBLNRuntimeError(f"input {name!r} has dtype {t.dtype}; the graph was compiled for {dtype}")
            if name in self.compiled.static and t.data_ptr() != self.compiled.static[name].data_ptr():
                raise RBLNRuntimeError(f"input {name!r} is a static-address input; pass the tensor marked at compile")
            if kv is not None and name in BLOCK_INPUTS:
                _in_range(name, t, kv.shape[1], "kv_blocks")
            if kv is not None and name in POSITION_INPUTS:
                _in_range(name, t, kv.shape[3], "max_seq_len")
        self.calls += 1
        with torch.no_grad():
            return self.compiled.module(*args)


def _in_range(name: str, t: torch.Tensor, bound: int, what: str) -> None:
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= bound):
        raise RBLNRuntimeError(f"input {name!r} indexes outside the compiled {what}={bound}: {t.tolist()}")
