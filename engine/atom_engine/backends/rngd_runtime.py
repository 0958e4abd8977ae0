"""What the rngd backend calls at run time on FuriosaAI's public packages (furiosa-torch, furiosa-smi).

Running needs Furiosa's driver-side library (``librenegade.so``) and kernel driver, which no wheel ships, so the
runtime is one small seam: :class:`FuriosaRuntime` on the real packages, or a module named by the environment
variable ``ATOM_RNGD_RUNTIME`` that provides a ``Runtime`` class with the same methods (the tests' faithful fake,
``tests/fakes/furiosa_fake``). The compiler is never behind the seam: it runs here without a device.

Facts about the real runtime that shape the backend (furiosa-torch 2026.4.0, checked on this machine):
- ``set_fusion(k)`` fixes how many PEs form one device, once per process; a second call with another value raises
  ``RuntimeError: num_fusion is already set`` (``furiosa/torch/_C/device/__init__.pyi:138-141``), and asking for
  devices first fixes it to 1. RNGD has 8 PEs per chip, so the backend fuses ``8 * numDevices`` PEs into one device.
- ``furiosa.torch.is_available()`` is True without an NPU; the first allocation on ``furiosa:0`` then raises
  ``torch.OutOfMemoryError: failed to allocate 16 bytes``. Readiness therefore asks ``furiosa_smi.list_devices()``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

RUNTIME_ENV = "ATOM_RNGD_RUNTIME"
PES_PER_RNGD = 8  # processing elements per RNGD chip (furiosa/torch/_C/device/__init__.pyi:25)


class FuriosaRuntime:
    """The real runtime: furiosa-torch's device ``furiosa:N`` and furiosa-smi's device list."""

    name = "furiosa-torch"

    def list_devices(self) -> list[str]:
        import furiosa_smi

        return [d.device_name() for d in furiosa_smi.list_devices()]  # e.g. "npu0"

    def set_fusion(self, pes: int) -> None:
        import furiosa.torch

        furiosa.torch.set_fusion(pes)

    def module(self, compiled: Any, exported: Any) -> Any:  # noqa: ANN401 - furiosa.torch.CompileModule
        """The module the backend moves to its device (``.to("furiosa:N")``: Runnable._apply loads the binary and
        the weights, ``furiosa/torch/_module/runnable.py:116-133``) and calls with device inputs."""
        return compiled

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    def to_device(self, t: torch.Tensor, device: str) -> torch.Tensor:
        return t.to(device)


def load_runtime() -> Any:  # noqa: ANN401 - FuriosaRuntime or a module's Runtime with the same methods
    name = os.environ.get(RUNTIME_ENV)
    if not name:
        return FuriosaRuntime()
    return importlib.import_module(name).Runtime()
