"""``rebel.compile_context.CompileContext`` as Rebellions' own packages use it.

optimum-rbln 0.12.0 builds ONE context for every graph of a decoder-only model and marks each KV tensor as a
static address in it (optimum/rbln/transformers/models/decoderonly/modeling_decoderonly.py:262-272, used for the
prefill graph and every decoder graph at :275-334); the import path is ``from rebel.compile_context import
CompileContext`` (modeling_decoderonly.py:22). The static tensors name device memory that the runtimes of that
context share: the example tensor only describes it (prefill's examples are ``meta`` tensors, :280-282), so a host
tensor given here is never read or written by a runtime.
"""

from __future__ import annotations

import itertools

import torch

_ids = itertools.count(1)


class CompileContext:
    def __init__(self, use_weight_sharing: bool = False) -> None:
        # Keyword from modeling_decoderonly.py:263 (``CompileContext(use_weight_sharing=True)``); the fake refuses
        # any other keyword like a plain Python signature would.
        self.use_weight_sharing = use_weight_sharing
        self.uid = f"ctx-{next(_ids)}-{id(self):x}"
        self.static: dict[str, torch.Tensor] = {}

    def mark_static_address(self, tensor: torch.Tensor, name: str) -> None:
        # modeling_decoderonly.py:270: ``context.mark_static_address(tensor, name)``, name = the graph input's name.
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"mark_static_address takes a torch.Tensor; got {type(tensor).__name__}")
        if name in self.static and self.static[name] is not tensor:
            raise ValueError(f"static address {name!r} is already marked with another tensor in this context")
        self.static[name] = tensor
