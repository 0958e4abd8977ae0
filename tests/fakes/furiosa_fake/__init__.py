"""A faithful fake of furiosa-torch's device runtime (RNGD), selected with ``ATOM_RNGD_RUNTIME=furiosa_fake``.

No wheel ships Furiosa's driver library (``librenegade.so``) or kernel driver, so nothing can run on ``furiosa:N``
here; the compiler does run (the backend compiles for real and this fake loads what it compiled). The fake keeps
"device memory" private and executes the same ``torch.export`` program the compiler compiled, on the CPU, after
enforcing what the real runtime enforces. Every rule names the furiosa-torch 2026.4.0 file it comes from; rules
marked *observed* were seen on this machine with the real package and no device.

Knobs: ``ATOM_FAKE_RNGD_DEVICES`` (RNGD chips ``furiosa_smi.list_devices()`` reports; default 1, 0 = a host
without the driver) and ``ATOM_FAKE_RNGD_MEMORY_BYTES`` (device memory per chip; default RNGD's 48 GiB).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

PES_PER_CHIP = 8  # furiosa/torch/_C/device/__init__.pyi:25 ("In RNGD, there are 8 PEs in a chip")
FUSIONS = (1, 2, 4, 8, 16, 32)  # furiosa/torch/_C/device/__init__.pyi:24
RNGD_MEMORY_BYTES = 48 << 30  # 48 GB HBM3 per RNGD card


class DeviceTensor:
    """Memory on ``furiosa:N``. Host code reaches the data only through an explicit copy, ``.cpu()`` (what
    ``furiosa/torch/ext/transformers.py:63-64`` does to read KV back); a view of it (indexing) stays on the device,
    and ``.copy_(host)`` writes into it (``transformers.py:71-72``). Anything else that would read device memory from
    the host (a torch op, ``.numpy()``, ``.item()``, ``bool()``) raises."""

    def __init__(self, data: torch.Tensor, device: str, owner: Runtime | None = None) -> None:
        self._data = data
        self.device = device
        self._owner = owner  # set on the tensor that owns the allocation (not on views): freed with it

    def __del__(self) -> None:
        if self._owner is not None:
            self._owner.allocated[self.device] -= self._data.numel() * self._data.element_size()

    @property
    def shape(self) -> torch.Size:
        return self._data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self._data.dtype

    def size(self, dim: int | None = None) -> Any:  # noqa: ANN401 - torch.Size or int, as Tensor.size
        return self._data.size() if dim is None else self._data.size(dim)

    def dim(self) -> int:
        return self._data.dim()

    def numel(self) -> int:
        return self._data.numel()

    def cpu(self) -> torch.Tensor:
        return self._data.clone()

    def to(self, device: str | torch.device) -> torch.Tensor | DeviceTensor:
        if str(device) == "cpu":
            return self.cpu()
        if str(device) == self.device:
            return self
        raise RuntimeError(f"the fake runs one device per tensor; {self.device} -> {device} is not modelled")

    def __getitem__(self, index: Any) -> DeviceTensor:  # noqa: ANN401
        return DeviceTensor(self._data[index], self.device)

    def copy_(self, src: torch.Tensor) -> DeviceTensor:
        if isinstance(src, DeviceTensor):
            src = src._data
        if tuple(src.shape) != tuple(self.shape) or src.dtype != self.dtype:
            raise RuntimeError(f"copy_ of a {src.dtype} {tuple(src.shape)} tensor into a {self.dtype}"
                               f" {tuple(self.shape)} device tensor")
        self._data.copy_(src)
        return self

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # noqa: ANN401
        raise RuntimeError(f"{getattr(func, '__name__', func)} on a furiosa device tensor from host code: device"
                           " memory is read only by an explicit copy (.cpu())")

    def _host_access(self, *_: Any) -> Any:  # noqa: ANN401
        raise RuntimeError("host access to furiosa device memory without an explicit copy (.cpu())")

    numpy = item = tolist = __array__ = __bool__ = __float__ = __int__ = __index__ = __iter__ = _host_access
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __matmul__ = _host_access
    __eq__ = __lt__ = __gt__ = __le__ = __ge__ = __neg__ = _host_access
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"DeviceTensor(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


class Runtime:
    """The methods of :class:`atom_engine.backends.rngd_runtime.FuriosaRuntime`, on fake devices."""

    name = "fake-furiosa"

    def __init__(self) -> None:
        self.chips = int(os.environ.get("ATOM_FAKE_RNGD_DEVICES", "1"))
        self.memory_per_chip = int(os.environ.get("ATOM_FAKE_RNGD_MEMORY_BYTES", str(RNGD_MEMORY_BYTES)))
        self.fusion: int | None = None
        self.allocated: dict[str, int] = {}

    # -- furiosa_smi ------------------------------------------------------------------------------------------
    def list_devices(self) -> list[str]:
        return [f"npu{i}" for i in range(self.chips)]

    # -- furiosa.torch device API ---------------------------------------------------------------------------
    def set_fusion(self, pes: int) -> None:
        if pes not in FUSIONS:  # the native "num_fusion must be 1, 2, 4, 8, 16, 32 but got" (observed)
            raise RuntimeError(f"num_fusion must be 1, 2, 4, 8, 16, 32 but got {pes}")
        # Once per process (furiosa/torch/_C/device/__init__.pyi:27,138-141); the same value again is accepted,
        # another raises (observed: "num_fusion is already set, Fusion { num_fusion: 8, ... }").
        if self.fusion is not None and self.fusion != pes:
            raise RuntimeError(f"num_fusion is already set, Fusion {{ num_fusion: {self.fusion} }}")
        self.fusion = pes

    def _fused(self) -> int:
        # Asking for a device before set_fusion fixes the fusion to 1 (observed: get_available_devices()).
        if self.fusion is None:
            self.fusion = 1
        return self.fusion

    def _check_device(self, device: str) -> str:
        kind, _, index = str(device).partition(":")
        if kind != "furiosa" or not index.isdigit():
            raise RuntimeError(f"not a furiosa device: {device!r}")
        pes = self._fused()
        logical = self.chips * PES_PER_CHIP // pes if pes <= PES_PER_CHIP else self.chips // (pes // PES_PER_CHIP)
        if int(index) >= max(logical, 0) and self.chips > 0:
            raise RuntimeError(f"invalid device ID: {device} (fusion {pes} over {self.chips} RNGD gives {logical})")
        return f"furiosa:{int(index)}"

    def _allocate(self, device: str, nbytes: int) -> None:
        device = self._check_device(device)
        # Without the driver the first allocation fails, not import or is_available() (observed:
        # "torch.OutOfMemoryError: failed to allocate 16 bytes", 4096 on another host, after librenegade.so fails
        # to open).
        if self.chips == 0:
            raise torch.OutOfMemoryError(f"failed to allocate {nbytes} bytes")
        pes = self._fused()
        capacity = self.memory_per_chip * max(1, pes // PES_PER_CHIP)
        if pes < PES_PER_CHIP:
            capacity = self.memory_per_chip * pes // PES_PER_CHIP
        used = self.allocated.get(device, 0)
        if used + nbytes > capacity:  # c10::OutOfMemoryError from the allocator (N3c1016OutOfMemoryErrorE in _C)
            raise torch.OutOfMemoryError(f"failed to allocate {nbytes} bytes on {device} ({used} of {capacity}"
                                         " bytes in use)")
        self.allocated[device] = used + nbytes

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: str) -> DeviceTensor:
        data = torch.zeros(shape, dtype=dtype)
        self._allocate(device, data.numel() * data.element_size())
        return DeviceTensor(data, self._check_device(device), self)

    def to_device(self, t: torch.Tensor, device: str) -> DeviceTensor:
        self._allocate(device, t.numel() * t.element_size())
        return DeviceTensor(t.detach().clone(), self._check_device(device), self)

    def module(self, compiled: Any, program: Callable[..., Any]) -> FakeCompileModule:  # noqa: ANN401
        return FakeCompileModule(self, compiled, program)


class FakeCompileModule:
    """A real ``furiosa.torch.CompileModule`` (compiled here by the real compiler), run on a fake device.

    The compiled ``ir.Runnable``'s own metadata sets the rules: ``expected_num_fusion`` and ``input_dram_shapes``.
    The outputs come from executing ``program``, the ``torch.export`` program the compiler compiled, on the CPU."""

    def __init__(self, rt: Runtime, compiled: Any, program: Callable[..., Any]) -> None:  # noqa: ANN401
        self.rt = rt
        self.compiled = compiled
        self.runnable = compiled.runnable._inner
        self.program = program
        self.weights = tuple(compiled.module_weight.weights)
        self.shapes = [(tuple(s.host_sizes), s.dtype) for s in self.runnable.input_dram_shapes]
        self.device: str | None = None

    def to(self, device: str) -> FakeCompileModule:
        # Runnable._apply moves the binary and the weights (furiosa/torch/_module/runnable.py:116-133): both are
        # device allocations, so a model that does not fit fails here.
        nbytes = self.runnable.binary.numel() * self.runnable.binary.element_size()
        nbytes += sum(w.numel() * w.element_size() for w in self.weights)
        self.rt._allocate(device, nbytes)
        self.device = self.rt._check_device(device)
        return self

    def __call__(self, *args: Any) -> Any:  # noqa: ANN401
        # CompileModule.forward flattens weights + args by the exported input spec; a different arity does not
        # match it (furiosa/torch/export/exported_program.py:49-53, ValueError).
        user = len(self.shapes) - len(self.weights)
        if len(args) != user:
            raise ValueError(f"Given arguments don't match expected argument spec ({len(args)} given, the compiled"
                             f" graph takes {user})")
        # Runnable.forward checks the fusion first (furiosa/torch/_module/runnable.py:173-178).
        current = self.rt._fused()
        if current != self.runnable.expected_num_fusion:
            raise RuntimeError("Expected device fusion of compiled Runnable doesn't match current device fusion "
                               f"({self.runnable.expected_num_fusion} != {current})")
        # ir.Runnable.execute on a Runnable never moved to a device: ValueError "Runnable is not loaded" (observed).
        if self.device is None:
            raise ValueError("Runnable is not loaded")
        for i, a in enumerate(args):
            # furiosa/torch/_utils/__init__.py:279-303 (ensure_furiosa_device), as the runnable op does.
            if not isinstance(a, DeviceTensor):
                where = a.device if isinstance(a, torch.Tensor) else type(a).__name__
                raise RuntimeError(f"inputs must be placed in Furiosa device, but {where} (input {i})")
            if a.device != self.device:
                raise RuntimeError(f"all inputs should be in same device, but {{{a.device}, {self.device}}}")
            want = self.shapes[len(self.weights) + i]
            if (tuple(a.shape), a.dtype) != want:  # static shapes: the input_dram_shapes it was compiled for
                raise RuntimeError(f"input {i} is {a.dtype} {tuple(a.shape)}; the Runnable was compiled for"
                                   f" {want[1]} {want[0]}")
        with torch.no_grad():
            out = self.program(*(a._data for a in args))  # mutates the KV inputs in place, as the device does
        outs = out if isinstance(out, (list, tuple)) else (out,)
        results = [DeviceTensor(o, self.device) for o in outs]  # outputs live on the device too
        return results[0] if not isinstance(out, (list, tuple)) else results
