"""The atom backend: prefill, decode and block copy compiled to static shapes with the RBLN SDK (``rebel``).

Each graph is compiled once from torch (``rebel.compile_from_torch`` with its ``input_info``) and run by its own
``rebel.Runtime``. The KV cache tensors are inputs of every graph, marked as static addresses so all runtimes
update the same memory in place.
"""

from __future__ import annotations

import torch

from atom_engine.backends.graphs import CopyBlockGraph, ForwardGraph
from atom_engine.model.llama import LlamaForCausalLM

INDEX_DTYPE = "int64"
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64"}


def import_rebel():  # noqa: ANN201 - the SDK module has no stubs
    try:
        import rebel
    except ImportError as exc:
        raise RuntimeError(
            "the atom backend needs the RBLN SDK (python package rebel-compiler), which is not installed here;"
            " install it from Rebellions' package index on a host with ATOM NPUs, or set backend: cpu"
        ) from exc
    return rebel


class AtomBackend:
    def __init__(self, model: LlamaForCausalLM, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                 lanes: int, chunk: int, device: int = 0) -> None:
        rebel = import_rebel()
        self.k_cache, self.v_cache = k_cache, v_cache
        kv = [("k_cache", list(k_cache.shape), DTYPE_NAMES[k_cache.dtype]),
              ("v_cache", list(v_cache.shape), DTYPE_NAMES[v_cache.dtype])]

        def compile_graph(module: torch.nn.Module, inputs: list[tuple[str, list[int], str]]):  # noqa: ANN202
            ctx = rebel.CompileContext(use_weight_sharing=True)
            ctx.mark_static_address(k_cache, "k_cache")
            ctx.mark_static_address(v_cache, "v_cache")
            examples = [self.k_cache if n == "k_cache" else self.v_cache if n == "v_cache"
                        else torch.zeros(shape, dtype=getattr(torch, dt)) for n, shape, dt in inputs]
            compiled = rebel.compile_from_torch(module.eval(), input_info=inputs, example_inputs=examples,
                                                compile_context=ctx)
            return rebel.Runtime(compiled, tensor_type="pt", device=device)

        def forward_inputs(b: int, t: int) -> list[tuple[str, list[int], str]]:
            return [("input_ids", [b, t], INDEX_DTYPE), ("positions", [b, t], INDEX_DTYPE),
                    ("slot_blocks", [b, t], INDEX_DTYPE), ("attn_blocks", [b], INDEX_DTYPE),
                    ("logits_index", [b], INDEX_DTYPE), *kv]

        graph = ForwardGraph(model)
        self.prefill_rt = compile_graph(graph, forward_inputs(1, chunk))
        self.decode_rt = compile_graph(graph, forward_inputs(lanes, 1))
        self.copy_rt = compile_graph(CopyBlockGraph(), [("src", [1], INDEX_DTYPE), ("dst", [1], INDEX_DTYPE), *kv])

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
                logits_index: torch.Tensor) -> torch.Tensor:
        return _first(self.prefill_rt(ids, positions, slots, blocks, logits_index, self.k_cache, self.v_cache))

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
               logits_index: torch.Tensor) -> torch.Tensor:
        return _first(self.decode_rt(ids, positions, slots, blocks, logits_index, self.k_cache, self.v_cache))

    def copy_block(self, src: int, dst: int) -> None:
        self.copy_rt(torch.tensor([src]), torch.tensor([dst]), self.k_cache, self.v_cache)


def _first(out: object) -> torch.Tensor:
    # Runtimes return a tensor, or a list of them for multi-output graphs.
    return torch.as_tensor(out[0] if isinstance(out, (list, tuple)) else out)
