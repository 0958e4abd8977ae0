"""Each component's figures, as typed objects: what /metrics shows (:mod:`atom_engine.server.metrics`).

The metrics table names its figures by attribute of these classes (``BatcherStats.running``): a field renamed or
removed here is an AttributeError when the table is imported, not a metric that silently stops being exported.
The classes have slots, so a misspelled counter (``stats.prefil_requests += 1``) fails where it is written too.

This module imports nothing heavy (no torch): the server builds its metrics table before the model loads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields

from atom_engine.tally import Snapshot


class ByName(Mapping[str, float]):
    """Read-only access by field name (``counters["draft_tokens"]``, ``dict(counters)``) for in-process callers
    (tests, benchmarks); writes go by attribute, and an unknown name is a KeyError."""

    __slots__ = ()

    def __getitem__(self, name: str) -> float:
        if name not in self._names():
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def _names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self))  # type: ignore[arg-type]


# -- the engine (standalone and decode) ----------------------------------------------------------------


@dataclass(slots=True)
class KVStats:
    """Where the KV blocks are (:meth:`atom_engine.kv_blocks.KVBlocks.stats`), and the prefix cache's counters."""

    kv_blocks: int
    free_blocks: int
    lane_blocks: int
    cached_blocks: int
    pinned_blocks: int
    kv_usage: float  # share of blocks held by lanes, scratch excluded, 0..1
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_hit_tokens: int


@dataclass(slots=True, eq=False)
class BatcherCounters(ByName):
    """The batcher's counters (``Batcher.counters``)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefill_tokens_computed: int = 0
    cached_prompt_tokens: int = 0
    steps: int = 0
    decode_steps: int = 0
    prefill_chunks: int = 0
    requests_finished: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    draft_tokens: int = 0
    draft_tokens_accepted: int = 0
    arrived_requests: int = 0  # at enqueue: an autoscaler's demand, not served
    arrived_prompt_tokens: int = 0
    arrived_max_tokens: int = 0  # the longest each arrival may decode: its demand on a lane, known at arrival
    # First token to end, summed over the requests that ended (cancelled and failed too: they held a lane as
    # long), and their max_tokens: seconds of lane per max_token asked, which turns arrivals into lanes needed.
    decode_seconds: float = 0.0
    decoded_max_tokens: int = 0
    # Prompt tokens this engine did not compute: copied from its prefix cache or imported from a prefill worker
    # (vLLM's prompt_tokens_cached: local and external).
    prompt_tokens_cached: int = 0


@dataclass(slots=True, eq=False)
class BatcherStats(BatcherCounters):
    """The counters, the queue and the lanes, and whether the batcher is idle (``Batcher.stats``)."""

    waiting: int = 0
    running: int = 0
    prefix_query_tokens: int = 0  # prompt tokens looked up in the prefix cache (0 without one)
    idle: float = 0.0  # 1.0: no request, no cancel, no transfer held
    waiting_for_kv: int = 0  # lanes held while their prompt's KV is computed remotely


@dataclass(frozen=True, slots=True)
class RequestStats:
    """The request histograms' snapshots and the finished requests by vLLM's reason
    (:class:`atom_engine.request_tallies.RequestTallies`)."""

    request_queue_time: Snapshot
    request_prefill_time: Snapshot
    request_decode_time: Snapshot
    request_inference_time: Snapshot
    request_time_per_output_token: Snapshot
    request_prompt_tokens: Snapshot
    request_generation_tokens: Snapshot
    iteration_tokens: Snapshot
    request_success: dict[str, int]
    num_preemptions: int = 0  # a lane keeps its block from admission to end: nothing is ever preempted


@dataclass(slots=True)
class EngineStats:
    """The engine's own: the runner's forward time and torch's intra-op threads."""

    forward_seconds: float
    cpu_threads: int


@dataclass(slots=True)
class RemoteStats:
    """Remote-only PD's connector (``RemoteConnector``): its counters, and its slot and prefetch gauges."""

    remote_prefills: int = 0
    remote_prefill_tokens: int = 0
    kv_bytes_imported: int = 0
    prefetch_started: int = 0
    prefetch_hits: int = 0
    prefetch_cancelled: int = 0
    prefetch_failed: int = 0
    prefetch_cached_tokens: int = 0
    slots_held: int = 0
    prefetch_ready: float = 0.0


@dataclass(slots=True)
class SelectiveStats(RemoteStats):
    """Selective PD's connector: the remote connector's figures and the prompts it prefilled locally."""

    selective_local_prefills: int = 0


@dataclass(slots=True)
class ClientStats:
    """The decode side's prefill client: its fetches, its transport's bytes and time, its breaker."""

    pd_attempts: int = 0
    pd_retries: int = 0
    pd_failures: int = 0
    pd_bytes_received: int = 0
    pd_transfer_seconds: float = 0.0
    pd_breaker_state: int = 0  # 0 closed, 1 half-open, 2 open
    pd_breaker_transitions: int = 0


# -- the servers ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class InFlightStats:
    """Requests not yet finished (:class:`atom_engine.server.load.InFlight`; the prefill role adds its KV
    transport's)."""

    requests_in_flight: int = 0


@dataclass(slots=True)
class ServingStats:
    """The OpenAI server's own: requests refused before queueing; without a connector (no PD) the connector's
    gauges read 0."""

    requests_rejected: int = 0
    slots_held: int = 0
    prefetch_ready: float = 0.0


# -- the prefill role -----------------------------------------------------------------------------------


@dataclass(slots=True)
class WorkerStats:
    """The prefill worker's counters, and (in :meth:`PrefillWorker.stats`) its blocks and threads."""

    prefill_tokens_computed: int = 0
    prefills_abandoned: int = 0  # the decoder left before or during the prefill: stopped, nothing shipped
    kv_blocks: int = 0
    free_blocks: int = 0
    cached_blocks: int = 0
    lane_blocks: int = 0
    cpu_threads: int = 0


@dataclass(slots=True)
class ServiceStats:
    """The prefill service's requests and sends."""

    prefill_requests: int = 0
    prefill_in_flight: int = 0  # read and not yet let go: queued, computing or sending
    prefill_sends_started: int = 0
    prefill_sends_failed: int = 0
    prefill_bytes_sent: int = 0
    prefill_leases_expired: int = 0


@dataclass(slots=True)
class QueueStats:
    """The prefill worker's compute queue (:class:`atom_engine.server.load.PrefillQueue`)."""

    running: int = 0
    waiting: int = 0
    prefill_tokens_waiting: int = 0
    prefill_busy_seconds: float = 0.0
