"""The cpu backend: the model runs eagerly with torch.

Eager torch is not bound to static shapes, so it does less work than the compiled graphs: it drops a prefill
chunk's pad tokens, skips empty decode lanes, attends over views of the cache instead of gathering whole blocks
(one call over the lanes' blocks when they lie close together, else each row over its own block cut to its
length), and packs the weights for few-row matmuls (oneDNN's layout where torch has it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from atom_engine.backends.cpu_attention import CpuAttention
from atom_engine.backends.graphs import CopyBlockGraph
from atom_engine.capabilities import Capabilities
from atom_engine.kv_blocks import SCRATCH_BLOCK
from atom_engine.model.llama import AttentionStrategy, LlamaForCausalLM


class CpuBackend:
    name = "cpu"
    # Eager torch has no shapes: prefill takes a [1, n] logits_index (prompt logprobs), decode several tokens per
    # lane (speculation), and a decode step may carry prefill chunks in the same forward (see mixed).
    capabilities = Capabilities(every_token_logits=True, verify=True, mixed=True)

    def __init__(self, model: LlamaForCausalLM, *, kv_blocks: int) -> None:
        model.pack()
        self.model = model
        self.copy = CopyBlockGraph()
        self.k_cache = torch.zeros(model.kv_shape(kv_blocks), dtype=model.dtype)
        self.v_cache = torch.zeros(model.kv_shape(kv_blocks), dtype=model.dtype)
        self.attention = CpuAttention(self.k_cache, self.v_cache, model.cfg.num_heads // model.cfg.num_kv_heads)

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
                logits_index: torch.Tensor) -> torch.Tensor:
        n = int(logits_index.max()) + 1
        rows = [(int(blocks[0]), int(positions[0, n - 1]) + 1)]
        return self._run(ids[:, :n], positions[:, :n], slots[:, :n], logits_index, self.attention.padded(
            rows, positions[:, :n]))

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor,
               logits_index: torch.Tensor) -> torch.Tensor:
        lane_blocks, lane_positions = blocks.tolist(), positions[:, 0].tolist()
        active = [i for i, b in enumerate(lane_blocks) if b != SCRATCH_BLOCK]
        rows = [(lane_blocks[i], lane_positions[i] + 1) for i in active]
        if len(active) == len(lane_blocks):
            return self._run(ids, positions, slots, logits_index, self.attention.padded(rows, positions))
        idx = torch.tensor(active, dtype=torch.long)
        part = self._run(ids[idx], positions[idx], slots[idx], logits_index[idx],
                         self.attention.padded(rows, positions[idx]))
        logits = part.new_zeros(len(lane_blocks), part.shape[-1])
        logits[idx] = part
        return logits

    def verify(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor
               ) -> torch.Tensor:
        """A speculative decode step: ``[lanes, T]`` tokens per lane (its last token and its draft, padded with
        tokens that write into the scratch block); the logits ``[N, vocab]`` of the N real tokens, lane by lane
        in order (pads and empty lanes have none: they are never computed, and a padded ``[lanes, T, vocab]``
        would cost a zero fill and a copy of the whole padded tensor a step, benchmarks/results/measured-in-place.md).
        The real tokens go through the model flat."""
        real = slots != SCRATCH_BLOCK  # pads and empty lanes write into the scratch block
        counts = real.sum(dim=1).tolist()
        active = [i for i, c in enumerate(counts) if c]
        ends = (positions.masked_fill(~real, -1).amax(dim=1) + 1).tolist()
        rows = [(int(blocks[i]), ends[i]) for i in active]
        n = sum(counts)
        flat = positions[real][None]
        return self._run(ids[real][None], flat, slots[real][None], torch.arange(n)[None],
                         self.attention.ragged(rows, flat, [counts[i] for i in active]))[0]

    def mixed(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, lanes: list[tuple[int, int]],
              chunks: list[tuple[int, int]]) -> torch.Tensor:
        """A decode step and prefill chunks in one forward, so the weights are read once for both. ``ids``,
        ``positions``, ``slots`` ``[N]``: each decode lane's tokens (its last token and draft; ``lanes``: its block
        and token count) in turn, then each chunk's (``chunks``: its block and token count). Returns the logits
        ``[K, vocab]`` of every decode token, then of each chunk's last token."""
        rows, at = [], 0
        for block, count in lanes:
            at += count
            rows.append((block, int(positions[at - 1]) + 1))
        index = list(range(at))
        for _, count in chunks:
            at += count
            index.append(at - 1)
        attention = self.attention.mixed(rows, positions[None], [count for _, count in lanes], chunks)
        return self._run(ids[None], positions[None], slots[None], torch.tensor(index)[None], attention)[0]

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, logits_index: torch.Tensor,
             attention: AttentionStrategy) -> torch.Tensor:
        return self.model(ids, positions, slots, logits_index, self.k_cache, self.v_cache, attention)

    def copy_block(self, src: int, dst: int) -> None:
        self.copy(torch.tensor([src]), torch.tensor([dst]), self.k_cache, self.v_cache)

    # -- PD: the cache is host memory, so a block's KV moves by slicing --------------------------------------------
    def export_kv(self, block: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_cache[:, block, :, start:end].clone(), self.v_cache[:, block, :, start:end].clone()

    def import_kv(self, block: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[2]
        self.k_cache[:, block, :, start:end] = k
        self.v_cache[:, block, :, start:end] = v

    # -- artifacts: nothing is compiled ------------------------------------------------------------------------
    def graph_manifest(self) -> list[dict[str, Any]]:
        return []

    def save(self, directory: Path) -> None:
        pass
