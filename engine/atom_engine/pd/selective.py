"""Selective disaggregation: with ``localPrefill`` allowed and prefill workers present, each prompt's KV comes
from wherever it is cheapest (as llm-d's prefix-based PD decider and Dynamo's conditional disaggregation do).

A lane's prompt is prefilled by a worker when its uncached suffix (after the prefix-cache copy) has at least
``remotePrefillMinTokens`` tokens and the pool's circuit breaker is closed; a short suffix costs less to compute
here than to ship, and with the pool down the decode pod serves on by itself instead of answering 503. The choice
is made once per request, when its lane first asks; a prompt sent to a worker whose fetch fails (the pool's first
failing window, before the breaker opens) is prefilled here after all. Remote-only pods (``localPrefill: false``)
use the :class:`~atom_engine.pd.remote.RemoteConnector` alone, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from atom_engine.errors import KVUnavailable
from atom_engine.kv_blocks import Allocation, KVBlocks
from atom_engine.kv_connector import LoadedKV
from atom_engine.pd.breaker import CircuitBreaker
from atom_engine.pd.remote import RemoteConnector
from atom_engine.sequence import FinishReason, Sequence
from atom_engine.stats import SelectiveStats

log = logging.getLogger("atom_engine.pd")


def prefill_remotely(uncached_tokens: int, min_tokens: int, pool_rejecting: bool) -> bool:
    """The rule: ship from a worker when the suffix is long enough and the pool is serving."""
    return uncached_tokens >= min_tokens and not pool_rejecting


class SelectiveConnector:
    """A :class:`~atom_engine.kv_connector.KVConnector` that sends long uncached suffixes to the prefill workers
    (through ``remote``) and leaves the rest to the batcher's local prefill."""

    def __init__(self, remote: RemoteConnector, breaker: CircuitBreaker, *, min_tokens: int) -> None:
        if remote.prefetch_next:
            raise ValueError("B1 prefetch runs remote-only (localPrefill false); selective PD never prefetches")
        self.remote_connector, self.breaker, self.min_tokens = remote, breaker, min_tokens
        self._choice: dict[str, bool] = {}  # request id -> prefilled by a worker
        self.local_prefills = 0  # prompts this connector left to the batcher's local prefill

    def ships(self, seq: Sequence) -> bool:
        choice = self._choice.get(seq.id)
        if choice is None:
            choice = self._choice[seq.id] = prefill_remotely(len(seq.prompt) - seq.computed, self.min_tokens,
                                                             self.breaker.rejecting)
            if not choice:
                self.local_prefills += 1
        return choice

    def bind(self, kv: KVBlocks, model: Any) -> None:
        self.remote_connector.bind(kv, model)

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        self.remote_connector.set_wakeup(wakeup)

    def allocate(self, seq: Sequence) -> Allocation | None:
        return None  # never a prefetch

    def poll(self, seq: Sequence) -> LoadedKV | None:
        try:
            return self.remote_connector.poll(seq)
        except KVUnavailable as exc:
            # The pool failed this prompt (its first failing window, or every worker it tried failed it): a pod
            # that may prefill serves it here rather than answer 503. Its lane and block are as the prefix-cache
            # copy left them (nothing of a failed fetch is imported), so local prefill goes on from there. A
            # worker's refusal of the request itself (KVRefused) is passed on: the client gets that 4xx.
            log.warning("event=selective_local_fallback request_id=%s error=%s", seq.id, exc)
            self._choice[seq.id] = False
            self.local_prefills += 1
            return None

    def release(self, seq: Sequence, ok: bool) -> None:
        self.remote_connector.release(seq, ok)

    def request_finished(self, seq: Sequence, reason: FinishReason) -> None:
        if self._choice.pop(seq.id, False):
            self.remote_connector.request_finished(seq, reason)

    def after_step(self, lanes: list[Sequence | None], next_waiting: Sequence | None) -> None:
        pass

    def busy(self) -> bool:
        return self.remote_connector.busy()

    def stats(self) -> SelectiveStats:
        return SelectiveStats(**asdict(self.remote_connector.stats()), selective_local_prefills=self.local_prefills)
