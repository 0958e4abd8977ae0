"""Where a lane's prompt KV comes from when it is not computed here: the KV connector the batcher is given.

Shaped as vLLM's KV connector (``vllm/distributed/kv_transfer/kv_connector/v1/base.py``), in two halves:

- the scheduler side, :class:`KVConnector`, called by the batcher: what a lane's block starts from
  (``allocate``, vLLM's ``get_num_new_matched_tokens`` / ``update_state_after_alloc``), whether the rest of the
  prompt's KV has arrived (``poll``: start the transfer when the lane first asks, hand over the KV once it is
  here), when a request is done with it (``release`` after the import, ``request_finished`` when the request
  ended first), and its own policy between steps (``after_step``: B1 prefetch);
- the worker side, the runner's ``load_kv``: the shipped KV into the lane's block, through the backend, and the
  first output token from the shipped logits, sampled with the request's own generator.

Without a connector the batcher prefills every prompt itself (local prefill); a connector may leave some prompts
to it too (``ships``: selective disaggregation). Pure Python: no torch, no sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from atom_engine.kv_blocks import Allocation, KVBlocks
from atom_engine.sequence import FinishReason, Sequence, TokenLogprob


@dataclass(frozen=True)
class LoadedKV:
    """The KV of prompt positions ``start..start+len(token_ids)`` and the prompt's last-token logits (tensors of
    the runner's kind), with the prompt logprobs when the request asked for them."""

    start: int
    token_ids: list[int]
    k: Any
    v: Any
    logits: Any
    prompt_logprobs: list[TokenLogprob | None] | None = None
    payload_bytes: int = 0


class KVConnector(Protocol):
    def ships(self, seq: Sequence) -> bool:
        """Whether ``seq``'s prompt KV comes from the connector (False: the batcher prefills it locally)."""

    def bind(self, kv: KVBlocks, model: Any) -> None:
        """Called by the engine once its model is loaded (vLLM's ``register_kv_caches``): its KV block table
        (where a prefetch pins the prompt's cached prefix) and the model, whose KV layout imports must match."""

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        """How the connector wakes the engine loop when KV arrives (the serving layer's)."""

    def allocate(self, seq: Sequence) -> Allocation | None:
        """The lane's block when the connector prepared it before admission (a prefetch: its prefix-cache entry
        is pinned, and ``seq`` will import the KV after it); None: the batcher allocates as usual."""

    def poll(self, seq: Sequence) -> LoadedKV | None:
        """Called at each step while ``seq`` holds a lane without its prompt's KV: starts the transfer of the
        tokens after ``seq.computed`` when none is under way (and a staging slot is free); returns the KV once
        it has arrived, raising the transfer's error if it failed."""

    def release(self, seq: Sequence, ok: bool) -> None:
        """The KV ``poll`` returned was imported (``ok``) or its import failed: its staging slot may be reused."""

    def request_finished(self, seq: Sequence, reason: FinishReason) -> None:
        """``seq`` ended (``reason``: a finish reason); a transfer still under way keeps its slot until its
        producer is done."""

    def after_step(self, lanes: list[Sequence | None], next_waiting: Sequence | None) -> None:
        """Between steps: the connector's own policy (B1 prefetch of the next waiting request)."""

    def busy(self) -> bool:
        """Holds a transfer or a slot: the engine is not idle."""

    def stats(self) -> object:
        """The connector's own counters and gauges: a stats dataclass (:mod:`atom_engine.stats`), which /metrics
        reads by attribute."""
