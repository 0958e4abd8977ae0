"""The model dtypes an engine runs, by their torch names, with their width. Torch-free: the settings and the
operator's sizing read it; :func:`torch_dtype` and :func:`dtype_name` map to torch for the model side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
DTypeName = Literal[tuple(DTYPE_BYTES)]  # type: ignore[valid-type]  # the settings' field: these names only
# What an AtomDeployment may ask for: float64 is for the engine's own exactness tests, never a deployment.
DEPLOYABLE = tuple(name for name in DTYPE_BYTES if name != "float64")
DeployableDType = Literal[DEPLOYABLE]  # type: ignore[valid-type]


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}; got {name!r}")
    import torch

    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``; a dtype no engine runs is an error naming it."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {name} is not one of {', '.join(DTYPE_BYTES)}")
    return name
