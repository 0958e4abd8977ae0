"""A fake RBLN SDK (``rebel``), written from the call sites in Rebellions' public packages, not from our code.

Every rule names where it comes from, inside the wheels of optimum-rbln 0.12.0 (``optimum/rbln/...``) and
vllm-rbln 0.12.0 (``vllm_rbln/...``). The NPU itself is faked: a graph runs as its torch module on the CPU, and
"device memory" is CPU tensors that only the runtimes reach. What the fake enforces:

- ``compile_from_torch(module, input_info=[(name, shape, dtype)], npu=, num_devices=, example_inputs=,
  compile_context=)``; the keywords are those of ``compile``, which optimum probes for ``num_devices``
  (utils/runtime_utils.py:25-37) and calls with (modeling_base.py:531-537, decoderonly/modeling_decoderonly.py:
  247-254). Unknown keywords are refused.
- One ``CompileContext`` shared by the graphs of a model; static addresses (the KV) are device buffers owned by
  that context on the runtime's devices: the tensors marked at compile (``meta`` ones in optimum) are never read
  or written (modeling_decoderonly.py:262-334).
- ``Runtime(compiled, tensor_type="pt", device=int|list[int]|None, activate_profiler=, timeout=)``
  (modeling_decoderonly.py:637-657) with optimum's device checks and messages (utils/runtime_utils.py:141-176).
- A call passes the graph's non-static inputs only, positionally, plus an optional ``out=``
  (utils/runtime_utils.py:195-201; decoderonly_runtime_utils.py:347-357 and :631-642): any other arity is refused.
- ``compiled.save(path)`` / ``RBLNCompiledModel(path)`` (modeling_base.py:190-213; the cosmos guardrail saves
  ``.rbln`` files with ``compiled_model.save``, diffusers/pipelines/cosmos/cosmos_guardrail.py:215-218).
- Prefill chunk: a positive multiple of 64 (transformers/modeling_attention_utils.py:92-96).
- 16 GiB of DRAM per ATOM less the 288 MiB system region (utils/runtime_utils.py:48-54); a runtime that does
  not fit fails with "Lack of device memory" (the words optimum matches, modeling_base.py:360-378).
- Devices: ``RBLN_VISIBLE_DEVICES`` (``RBLN_DEVICES`` is deprecated but preferred by the runtime when both are
  set, vllm_rbln/platform/__init__.py:259-277). ``REBEL_FAKE_NPUS`` (default 1) says how many cards this fake
  host has when neither is set; ``REBEL_FAKE_NPU_NAME`` their product name.
"""

from __future__ import annotations

import inspect
import math
import os
import weakref
from pathlib import Path
from typing import Any

import torch

from rebel.compile_context import CompileContext

__version__ = "0.0.0+fake"
__all__ = ["CompileContext", "RBLNCompiledModel", "RBLNRuntimeError", "Runtime", "compile", "compile_from_torch",
           "device_count", "get_npu_name", "npu_is_available"]

# utils/runtime_utils.py:48-54: an RBLN-CA (ATOM) has 16 GiB of DRAM and reserves 288 MiB per chiplet; ATOM
# reports one chiplet (transformers/modeling_attention_utils.py:320).
DRAM_BYTES = 16 * 2**30
SYSTEM_BYTES = 288 * 2**20
AVAILABLE_BYTES = DRAM_BYTES - SYSTEM_BYTES
SAVE_FORMAT = "fake-rebel-compiled-1"

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
           "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
           "bool": torch.bool, "float8_e4m3fn": torch.float8_e4m3fn}

COMPILED: list[RBLNCompiledModel] = []  # every compile of this process (tests assert "no compile call")
LOADED: list[RBLNCompiledModel] = []  # every RBLNCompiledModel(path) of this process
_USED: dict[int, int] = {}  # device id -> bytes held by live runtimes
_STATES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (context uid, devices) -> _DeviceState


class RBLNRuntimeError(RuntimeError):
    pass


# -- the host's cards -----------------------------------------------------------------------------------------
def _visible() -> list[int]:
    # vllm_rbln/platform/__init__.py:259-265: the runtime takes RBLN_DEVICES and RBLN_VISIBLE_DEVICES and prefers
    # the former; entries are card numbers, comma or space separated (vllm_rbln/v1/worker/utils.py:262-266).
    for var in ("RBLN_DEVICES", "RBLN_VISIBLE_DEVICES"):
        raw = os.environ.get(var, "")
        if raw.strip():
            return sorted({int(t) for t in raw.replace(",", " ").split()})
    return list(range(int(os.environ.get("REBEL_FAKE_NPUS", "1"))))


def device_count() -> int:
    return len(_visible())


def get_npu_name(device: int = 0) -> str | None:
    # utils/runtime_utils.py:164: None for a device id that is not an NPU of this host.
    return os.environ.get("REBEL_FAKE_NPU_NAME", "RBLN-CA22") if device in _visible() else None


def npu_is_available(device: int = 0) -> bool:
    return get_npu_name(device) is not None


def _normalize_npu(npu: str) -> str:
    # utils/runtime_utils.py:126-138: the form factor digit does not matter ("RBLN-CA22" ~ "RBLN-CA2").
    if npu.startswith(("RBLN-CA", "RBLN-CR")) and len(npu) == 9:
        return npu[:-1]
    return npu


# -- compile ----------------------------------------------------------------------------------------------------
def _dtype(name: Any, where: str) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise TypeError(f"{where}: unsupported dtype {name!r}")
    return _DTYPES[name]


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


class RBLNCompiledModel:
    """A compiled graph. ``RBLNCompiledModel(path)`` loads one written by ``save`` (modeling_base.py:212)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        data = torch.load(Path(path), map_location="cpu", weights_only=False)
        if not isinstance(data, dict) or data.get("format") != SAVE_FORMAT:
            raise RBLNRuntimeError(f"{path} is not a compiled RBLN model")
        self.__dict__.update({k: v for k, v in data.items() if k != "format"})
        LOADED.append(self)

    @classmethod
    def _compiled(cls, **fields: Any) -> RBLNCompiledModel:
        self = cls.__new__(cls)
        self.__dict__.update(fields)
        return self

    def save(self, path: str | os.PathLike[str]) -> None:
        # cosmos_guardrail.py:215-218 saves to a path ending in .rbln; modeling_base.py:193-212 loads *.rbln back.
        torch.save({"format": SAVE_FORMAT, **self.__dict__}, Path(path))

    # for tests
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: shape for name, shape, _ in self.input_info}


def compile(module: torch.nn.Module, input_info: list, *, npu: str | None = None, num_devices: int | None = None,
            example_inputs: list[torch.Tensor] | tuple[torch.Tensor, ...] | None = None,
            compile_context: CompileContext | None = None) -> RBLNCompiledModel:
    # The keywords: modeling_base.py:531-537 (input_info, npu, num_devices) plus what modeling_decoderonly.py:
    # 247-254 forwards (example_inputs, compile_context). ``num_devices`` is what utils/runtime_utils.py:25-37 probes.
    num_devices = 1 if num_devices is None else num_devices
    if not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices must be a positive int; got {num_devices!r}")
    info: list[tuple[str, tuple[int, ...], torch.dtype]] = []
    for entry in input_info:
        name, shape, dtype = entry
        # get_input_info (modeling_decoderonly.py:352-434): static shapes; [] is a scalar (query_position).
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ValueError(f"input {name!r}: static shapes only, positive ints; got {shape}")
        info.append((name, tuple(shape), _dtype(dtype, f"input {name!r}")))
    names = [n for n, _, _ in info]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate input names: {names}")
    by_name = {n: (s, d) for n, s, d in info}
    if "input_ids" in by_name and len(by_name["input_ids"][0]) == 2 and by_name["input_ids"][0][1] > 1:
        # A graph whose queries are longer than one token is a prefill (modeling_decoderonly.py:363); its length is
        # the prefill chunk, which optimum refuses unless it divides by 64 (modeling_attention_utils.py:92-96).
        if by_name["input_ids"][0][1] % 64:
            raise ValueError("`prefill_chunk_size` must be a positive integer divisible by 64.")
    static = dict(compile_context.static) if compile_context is not None else {}
    for name, tensor in static.items():
        if name not in by_name:
            continue  # a context may hold buffers other graphs of the model use
        shape, dtype = by_name[name]
        # configuration_utils.py:163-168: a static tensor must have the graph input's shape and dtype.
        if tuple(tensor.shape) != shape:
            raise RuntimeError(f"Different shape for dummy inputs. ({list(shape)} != {list(tensor.shape)})")
        if tensor.dtype != dtype:
            raise RuntimeError(f"Different dtype for dummy inputs ({dtype} != {tensor.dtype})")
    if example_inputs is not None:
        if len(example_inputs) != len(info):
            raise ValueError(f"{len(example_inputs)} example inputs for {len(info)} inputs in input_info")
        for (name, shape, dtype), t in zip(info, example_inputs, strict=True):
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(
                    f"example input {name!r} is {tuple(t.shape)} {t.dtype}; input_info says {shape} {dtype}")
            # configuration_utils.py:163-169: a static input's example IS the tensor marked in the context.
            if name in static and t is not static[name]:
                raise ValueError(f"example input {name!r} is a static address: pass the tensor marked in the context")
    weights: dict[str, int] = {}
    seen: set[int] = set()
    for key, t in [*module.named_parameters(), *module.named_buffers()]:
        if t.device.type != "meta" and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            weights[key] = t.numel() * t.element_size()
    compiled = RBLNCompiledModel._compiled(
        module=module.eval(), input_info=info, num_devices=num_devices,
        npu=npu or get_npu_name(0) or os.environ.get("REBEL_FAKE_NPU_NAME", "RBLN-CA22"),
        static={n: (by_name[n][0], by_name[n][1]) for n in static if n in by_name},
        ctx_uid=compile_context.uid if compile_context is not None else None,
        weight_sharing=bool(compile_context is not None and compile_context.use_weight_sharing),
        weights=weights, sdk=__version__,
    )
    COMPILED.append(compiled)
    return compiled


def compile_from_torch(module: torch.nn.Module, input_info: list, **kwargs: Any) -> RBLNCompiledModel:
    # utils/runtime_utils.py:29-31: compile_from_torch forwards **kwargs to compile; an unknown one is refused there.
    params = inspect.signature(compile).parameters
    for key in kwargs:
        if key not in params or key in ("module", "input_info"):
            raise TypeError(f"compile_from_torch() got an unexpected keyword argument {key!r}")
    return compile(module, input_info, **kwargs)


# -- run ------------------------------------------------------------------------------------------------------
class _DeviceState:
    """The static buffers and shared weights of one compile context on one set of devices."""

    def __init__(self, devices: tuple[int, ...]) -> None:
        self.devices = devices
        self.buffers: dict[str, torch.Tensor] = {}
        self.weights: set[str] = set()
        self.charged = [0]
        weakref.finalize(self, _release, devices, self.charged)


def _release(devices: tuple[int, ...], charged: list[int]) -> None:
    for d in devices:
        _USED[d] = _USED.get(d, 0) - charged[0]


def _resolve_devices(device: Any, compiled: RBLNCompiledModel) -> tuple[int, ...]:
    # utils/runtime_utils.py:141-176, with its messages.
    n = compiled.num_devices
    if device is None:
        device = list(range(n))
    elif isinstance(device, bool):
        raise RBLNRuntimeError(f"Invalid device: {device}")
    elif isinstance(device, int):
        device = [device]
    elif isinstance(device, list):
        if any(not isinstance(d, int) or isinstance(d, bool) for d in device):
            raise RBLNRuntimeError("Device must be a(n) (list of) integer(s).")
    else:
        raise RBLNRuntimeError(f"Invalid device: {device}")
    # optimum checks the length of a list only; the fake also counts an int as one device, since a graph compiled
    # for n devices cannot run on fewer.
    if len(device) != n:
        raise RBLNRuntimeError(f"The number of devices ({len(device)}) does not match `num_devices` ({n}).")
    for d in device:
        if get_npu_name(d) is None:
            raise RBLNRuntimeError(
                f"Device {d} is not a valid NPU device. Please check your NPU status with 'rbln-smi' command.")
    if device_count() < n:
        raise RBLNRuntimeError(
            f"`num_devices` ({n}) is greater than the number of available devices {device_count()}.")
    for d in device:
        name = get_npu_name(d)
        if _normalize_npu(name) != _normalize_npu(compiled.npu):
            raise RBLNRuntimeError(f"Device {d} ({name}) is not on the same NPU as {compiled.npu}.")
    if len(set(device)) != len(device):
        raise RBLNRuntimeError(f"Invalid device: {device}")
    return tuple(device)


class Runtime:
    def __init__(self, compiled: RBLNCompiledModel, tensor_type: str = "pt", device: int | list[int] | None = None,
                 activate_profiler: bool | None = None, timeout: int | None = None) -> None:
        # The keywords of modeling_decoderonly.py:648-654.
        if not isinstance(compiled, RBLNCompiledModel):
            raise TypeError(f"Runtime takes an RBLNCompiledModel; got {type(compiled).__name__}")
        if tensor_type != "pt":
            raise NotImplementedError("the fake rebel runs torch tensors only (tensor_type='pt')")
        self.compiled = compiled
        self.devices = _resolve_devices(device, compiled)
        self.calls = 0
        key = (compiled.ctx_uid or f"graph-{id(compiled):x}", self.devices)
        state = _STATES.get(key)
        if state is None:
            state = _DeviceState(self.devices)
            _STATES[key] = state
        self.state = state
        new_static = {n: spec for n, spec in compiled.static.items() if n not in state.buffers}
        for n, (shape, dtype) in compiled.static.items():
            if n in state.buffers and (tuple(state.buffers[n].shape), state.buffers[n].dtype) != (shape, dtype):
                raise RBLNRuntimeError(f"static address {n!r} is {tuple(state.buffers[n].shape)} on the device;"
                                       f" this graph was compiled for {shape}")
        if compiled.weight_sharing:  # weights held once per context (use_weight_sharing=True)
            new_weights = {k: b for k, b in compiled.weights.items() if k not in state.weights}
        else:
            new_weights = dict(compiled.weights)
        n = len(self.devices)  # tensor parallel: weights and KV spread over the devices
        per_static = -(-sum(_nbytes(shape, dtype) for shape, dtype in new_static.values()) // n)
        per_weights = -(-sum(new_weights.values()) // n)
        for d in self.devices:
            if _USED.get(d, 0) + per_static + per_weights > AVAILABLE_BYTES:
                raise RBLNRuntimeError(
                    f"Lack of device memory: device {d} needs {per_static + per_weights} more bytes;"
                    f" {_USED.get(d, 0)} of {AVAILABLE_BYTES} bytes are in use")
        for d in self.devices:
            _USED[d] = _USED.get(d, 0) + per_static + per_weights
        if compiled.weight_sharing:
            state.weights |= set(new_weights)
            state.charged[0] += per_static + per_weights
        else:  # each runtime holds its own copy of the weights, released with it
            state.charged[0] += per_static
            weakref.finalize(self, _release, self.devices, [per_weights])
        for n, (shape, dtype) in new_static.items():
            state.buffers[n] = torch.zeros(shape, dtype=dtype)  # device memory: no host tensor is ever aliased

    def __call__(self, *args: torch.Tensor, out: torch.Tensor | list[torch.Tensor] | None = None) -> Any:
        # utils/runtime_utils.py:195-201: positional tensors (Nones filtered out by optimum) and ``out``.
        compiled = self.compiled
        inputs = [(n, s, d) for n, s, d in compiled.input_info if n not in compiled.static]
        if len(args) != len(inputs):
            names = ", ".join(n for n, _, _ in inputs)
            raise RBLNRuntimeError(f"the runtime takes {len(inputs)} inputs ({names}; static addresses are device"
                                   f" memory, never arguments); got {len(args)}")
        full: list[torch.Tensor] = []
        given = iter(args)
        for name, shape, dtype in compiled.input_info:
            if name in compiled.static:
                full.append(self.state.buffers[name])
                continue
            t = next(given)
            if not isinstance(t, torch.Tensor):
                raise RBLNRuntimeError(f"input {name!r} must be a torch.Tensor; got {type(t).__name__}")
            if t.device.type != "cpu":
                raise RBLNRuntimeError(f"input {name!r} is on {t.device}; the runtime copies host tensors")
            if tuple(t.shape) != shape:
                raise RBLNRuntimeError(f"input {name!r} has shape {tuple(t.shape)}; the graph was compiled for {shape}")
            if t.dtype != dtype:
                raise RBLNRuntimeError(f"input {name!r} has dtype {t.dtype}; the graph was compiled for {dtype}")
            full.append(t.clone())  # host -> device
        try:
            with torch.no_grad():
                result = compiled.module(*full)
        except (IndexError, RuntimeError) as exc:  # out-of-range indices fault the device
            raise RBLNRuntimeError(f"the graph faulted on the device: {exc}") from exc
        self.calls += 1
        outputs = [result] if isinstance(result, torch.Tensor) else list(result)
        host = [o.detach().clone() for o in outputs]  # device -> host copies: never views of device memory
        if out is not None:
            targets = [out] if isinstance(out, torch.Tensor) else list(out)
            for target, value in zip(targets, host, strict=True):
                target.copy_(value)
            return out
        return host[0] if len(host) == 1 else host

    def __repr__(self) -> str:
        return f"<fake rebel.Runtime devices={list(self.devices)} inputs={len(self.compiled.input_info)}>"


def device_bytes_in_use(device: int) -> int:
    """For tests: the bytes live runtimes hold on ``device``."""
    return _USED.get(device, 0)
