"""Prometheus metrics: the vLLM names gateways and dashboards read, plus the engine's own (``atom:``).

Gauges and counters are read from the engine at scrape time (one source of truth, no double counting); the
latency histograms are observed per request by the server. Each server has its own registry, so several can
live in one process (tests).

The table names each figure by attribute of a component's stats class (:mod:`atom_engine.stats`), so a renamed
or removed field is an AttributeError when this module is imported, not a metric silently gone; a role's server
hands the collector its components' stats objects at each scrape.

``vllm:cache_config_info`` is vLLM's info gauge (value 1, the configuration in its labels); the Gateway API
Inference Extension's endpoint picker reads ``block_size`` and ``num_gpu_blocks`` from it to size its prefix
index per pod and to cut prompts into hash blocks. ``atom:cpu_threads_info`` is one in the same style: the thread
count the process chose at start and the bound that decided it (:mod:`atom_engine.cpu_allowance`), so a dashboard
sees why a pod runs on fewer threads than its node has cores without reading its start-up log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, is_dataclass
from types import MemberDescriptorType
from typing import Literal

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from atom_engine import buckets
from atom_engine.cpu_allowance import Allowance
from atom_engine.stats import (
    BatcherStats,
    ClientStats,
    EngineStats,
    InFlightStats,
    KVStats,
    QueueStats,
    RemoteStats,
    RequestStats,
    SelectiveStats,
    ServiceStats,
    ServingStats,
    WorkerStats,
)
from atom_engine.tally import Snapshot

Figures = Callable[[], Sequence[object]]  # a role's components' stats objects (atom_engine.stats), read per scrape

# The prefix granularity reported to routers, in tokens: vLLM's default block size. Our blocks hold a whole
# sequence and the prefix cache reuses any common prefix length, so a router may hash prompts at any
# granularity; reporting maxSeqLen would make every prompt shorter than one hash block, i.e. never matched.
ROUTER_BLOCK_TOKENS = 16

# vLLM labels each of its series with its engine core's index (``engine``, one per data-parallel rank); a process
# here runs one engine, so its series say engine "0", and a query written for vLLM (``sum by (engine)``) works.
ENGINE_INDEX = "0"


@dataclass(frozen=True)
class Row:
    """One metric: its kind, its help, and the field it shows, by attribute of a stats class (``BatcherStats.
    running``). Where roles differ, several: the first whose component the role has is shown; a role with none of
    them does not export the metric."""

    kind: Literal["gauge", "counter", "histogram"]
    doc: str
    sources: tuple[MemberDescriptorType, ...]

    def __post_init__(self) -> None:
        if self.kind not in ("gauge", "counter", "histogram"):
            raise ValueError(f"a metric is a gauge, a counter or a histogram; got {self.kind!r}")
        for source in self.sources:
            if not isinstance(source, MemberDescriptorType) or not is_dataclass(source.__objclass__) or \
                    source.__name__ not in {f.name for f in fields(source.__objclass__)}:
                raise TypeError(f"a metric reads a stats dataclass's field (BatcherStats.running); got {source!r}")

    def value(self, figures: Sequence[object]) -> float | None:
        """The first source's field, from the role's component of that class; None when the role has none."""
        found = self.read(figures)
        return None if found is None else float(found)  # type: ignore[arg-type]

    def read(self, figures: Sequence[object]) -> object | None:
        """The first source's field as the component holds it (a number, a histogram's snapshot, a mapping)."""
        for source in self.sources:
            found = [f for f in figures if isinstance(f, source.__objclass__)]
            if len(found) > 1:
                raise ValueError(f"two components report {source.__objclass__.__name__}: {found}")
            if found:
                return source.__get__(found[0])
        return None


def gauge(doc: str, *sources: MemberDescriptorType) -> Row:
    return Row("gauge", doc, sources)


def counter(doc: str, *sources: MemberDescriptorType) -> Row:
    return Row("counter", doc, sources)


def histogram(doc: str, *sources: MemberDescriptorType) -> Row:
    return Row("histogram", doc, sources)


B, K, R, W, Q = BatcherStats, KVStats, RemoteStats, WorkerStats, QueueStats
VLLM = {
    "vllm:num_requests_running": gauge("Requests holding a lane (prefill role: prompts computing).",
                                       B.running, Q.running),
    "vllm:num_requests_waiting": gauge("Requests in the waiting queue (prefill role: prompts queued for the"
                                       " worker).", B.waiting, Q.waiting),
    "vllm:kv_cache_usage_perc": gauge("Share of KV blocks (scratch excluded) held by lanes, 0..1.", K.kv_usage),
    "vllm:prefix_cache_queries": counter("Prompt tokens looked up in the prefix cache.", B.prefix_query_tokens),
    "vllm:prefix_cache_hits": counter("Prompt tokens found in the prefix cache.", K.prefix_cache_hit_tokens),
    "vllm:prompt_tokens": counter("Prompt tokens of admitted requests.", B.prompt_tokens),
    "vllm:generation_tokens": counter("Generated tokens.", B.generation_tokens),
    "vllm:spec_decode_num_draft_tokens": counter("Draft tokens fed to decode steps.", B.draft_tokens),
    "vllm:spec_decode_num_accepted_tokens": counter("Draft tokens the model agreed with (kept as output).",
                                                    B.draft_tokens_accepted),
    "vllm:prompt_tokens_cached": counter("Prompt tokens not computed here: copied from the prefix cache or imported"
                                         " from a prefill worker (local + external).", B.prompt_tokens_cached),
    "vllm:num_preemptions": counter("Requests preempted: always 0 (a lane keeps its KV block from admission to"
                                    " its end).", RequestStats.num_preemptions),
}
# Observed by the batcher once per request (atom_engine.request_tallies), read at scrape like the counters.
S = RequestStats
VLLM_HISTOGRAMS = {
    "vllm:request_queue_time_seconds": histogram("Time from arrival to a lane (vLLM's WAITING phase).",
                                                 S.request_queue_time),
    "vllm:request_prefill_time_seconds": histogram("Time from a lane to the first token (PREFILL phase).",
                                                   S.request_prefill_time),
    "vllm:request_decode_time_seconds": histogram("Time from the first token to the last (DECODE phase).",
                                                  S.request_decode_time),
    "vllm:request_inference_time_seconds": histogram("Time from a lane to the last token (RUNNING phase).",
                                                     S.request_inference_time),
    "vllm:request_time_per_output_token_seconds": histogram("A request's decode time over its tokens after the"
                                                            " first.", S.request_time_per_output_token),
    "vllm:request_prompt_tokens": histogram("Prompt tokens of finished requests.", S.request_prompt_tokens),
    "vllm:request_generation_tokens": histogram("Generated tokens of finished requests.",
                                                S.request_generation_tokens),
    "vllm:iteration_tokens_total": histogram("Tokens per engine step: prompt tokens prefilled here and tokens"
                                             " generated.", S.iteration_tokens),
}
REQUEST_SUCCESS = Row("counter", "Finished requests by vLLM's finished_reason (cancelled: abort).",
                      (S.request_success,))
del S
ATOM = {
    "atom:kv_blocks_total": gauge("KV blocks compiled in (kvBlocks).", K.kv_blocks, W.kv_blocks),
    "atom:kv_blocks_free": gauge("Free KV blocks.", K.free_blocks, W.free_blocks),
    "atom:kv_blocks_cached": gauge("KV blocks held by prefix-cache entries.", K.cached_blocks, W.cached_blocks),
    "atom:kv_blocks_lanes": gauge("KV blocks held by lanes.", K.lane_blocks, W.lane_blocks),
    "atom:kv_blocks_pinned": gauge("Prefix-cache entries pinned as copy sources.", K.pinned_blocks),
    "atom:cpu_threads": gauge("torch's intra-op threads (from cpuThreads or the container's CPU allowance;"
                              " atom:cpu_threads_info and the start-up log say which).", EngineStats.cpu_threads,
                              W.cpu_threads),
    "atom:engine_idle": gauge("1 when the batcher reports no work (no request, no held prefetch).", B.idle),
    "atom:pd_source_slots_held": gauge("PD source slots reserved.", R.slots_held, ServingStats.slots_held),
    "atom:requests_finished": counter("Requests that ended with stop or length.", B.requests_finished),
    "atom:requests_cancelled": counter("Requests cancelled (client gone).", B.requests_cancelled),
    "atom:requests_failed": counter("Requests that ended with an error.", B.requests_failed),
    "atom:requests_rejected": counter("Requests refused before queueing (400/429).", ServingStats.requests_rejected),
    "atom:prefill_tokens_computed": counter("Prompt tokens prefilled here.", B.prefill_tokens_computed,
                                            W.prefill_tokens_computed),
    "atom:pd_remote_prefills": counter("Shipments requested from prefill workers.", R.remote_prefills),
    "atom:pd_remote_prefill_tokens": counter("Prompt tokens whose KV was imported.", R.remote_prefill_tokens),
    "atom:pd_local_prefills": counter("Prompts a decode pod with prefill workers prefilled itself (selective PD:"
                                      " a short uncached suffix, or the pool down).",
                                      SelectiveStats.selective_local_prefills),
    "atom:pd_kv_bytes_imported": counter("Payload bytes of imported shipments.", R.kv_bytes_imported),
    "atom:pd_bytes_received": counter("Bytes read from prefill workers (all frames).", ClientStats.pd_bytes_received),
    "atom:pd_transfer_seconds": counter("Time from a frame's first byte to its last.",
                                        ClientStats.pd_transfer_seconds),
    "atom:pd_fetch_attempts": counter("Fetch attempts on prefill workers.", ClientStats.pd_attempts),
    "atom:pd_fetch_retries": counter("Fetches retried on another worker.", ClientStats.pd_retries),
    "atom:pd_fetch_failures": counter("Failed fetch attempts.", ClientStats.pd_failures),
    "atom:pd_breaker_state": gauge("The prefill pool's circuit breaker: 0 closed, 1 half-open, 2 open (fetches"
                                   " fail at once).", ClientStats.pd_breaker_state),
    "atom:pd_breaker_transitions": counter("Moves of the prefill pool's breaker.", ClientStats.pd_breaker_transitions),
    "atom:prefetch_started": counter("B1 prefetches started.", R.prefetch_started),
    "atom:prefetch_hits": counter("Prefetched shipments imported by their lane.", R.prefetch_hits),
    "atom:prefetch_cancelled": counter("Prefetched requests cancelled before import.", R.prefetch_cancelled),
    "atom:prefetch_failed": counter("Prefetches whose producer failed.", R.prefetch_failed),
    "atom:prefetch_cached_tokens": counter("Prompt tokens prefetches did not ship.", R.prefetch_cached_tokens),
    "atom:prefetch_ready": gauge("1 while a prefetched shipment waits for its lane.", R.prefetch_ready,
                                 ServingStats.prefetch_ready),
    "atom:prefill_requests": counter("Prefill requests received (prefill role).", ServiceStats.prefill_requests),
    "atom:prefill_bytes_sent": counter("Frame bytes sent (prefill role).", ServiceStats.prefill_bytes_sent),
    "atom:prefill_sends_started": counter("Frames whose sending began.", ServiceStats.prefill_sends_started),
    "atom:prefill_sends_failed": counter("Frames whose sending failed.", ServiceStats.prefill_sends_failed),
    "atom:prefill_in_flight": gauge("Prefill requests held: queued, computing or sending.",
                                    ServiceStats.prefill_in_flight),
    "atom:prefills_abandoned": counter("Prefills stopped because their decoder left.", W.prefills_abandoned),
    "atom:prefill_leases_expired": counter("Requests dropped: their decoder stopped renewing its lease (no"
                                           " heartbeat).", ServiceStats.prefill_leases_expired),
    # What an autoscaler reads (atom_engine.server.load, the batcher's arrivals).
    "atom:requests_in_flight": gauge("Requests not yet finished, on the API routes and the KV transport (streams"
                                     " included): 0 is idle.", InFlightStats.requests_in_flight),
    "atom:arrived_requests": counter("Requests queued (at arrival, before a lane).", B.arrived_requests),
    "atom:arrived_prompt_tokens": counter("Prompt tokens of queued requests.", B.arrived_prompt_tokens),
    "atom:arrived_max_tokens": counter("max_tokens of queued requests (at arrival).", B.arrived_max_tokens),
    "atom:request_decode_seconds": counter("Seconds from first token to end, summed over the requests that ended"
                                           " (vLLM's request_decode_time_seconds sum).", B.decode_seconds),
    "atom:decoded_max_tokens": counter("max_tokens of the requests in atom:request_decode_seconds.",
                                       B.decoded_max_tokens),
    "atom:pd_waiting_for_kv": gauge("Lanes held while their prompt's KV is computed remotely.", B.waiting_for_kv),
    "atom:prefill_tokens_waiting": gauge("Prompt tokens queued for the prefill worker.", Q.prefill_tokens_waiting),
    "atom:prefill_busy_seconds": counter("Time the prefill worker spent computing.", Q.prefill_busy_seconds),
}
del B, K, R, W, Q
TABLE = {**VLLM, **ATOM}


def series_labels(name: str, model_name: str) -> dict[str, str]:
    """A series' labels: vLLM's (model and engine) on a ``vllm:`` name, the model alone on the engine's own."""
    return {"model_name": model_name, "engine": ENGINE_INDEX} if name.startswith("vllm:") else \
        {"model_name": model_name}


class _StatsCollector:
    def __init__(self, figures: Figures, model_name: str) -> None:
        self.figures, self.model_name = figures, model_name

    def collect(self) -> Iterator[Metric]:
        figures = self.figures()
        if not all(is_dataclass(f) and not isinstance(f, type) for f in figures):
            raise TypeError(f"a role's figures are stats dataclasses (atom_engine.stats); got {figures!r}")
        for name, row in TABLE.items():
            value = row.value(figures)
            if value is None:
                continue
            labels = series_labels(name, self.model_name)
            family = (GaugeMetricFamily if row.kind == "gauge" else CounterMetricFamily)(name, row.doc,
                                                                                          labels=list(labels))
            family.add_metric(list(labels.values()), value)
            yield family
        for name, row in VLLM_HISTOGRAMS.items():
            snap = row.read(figures)
            if snap is None:
                continue
            assert isinstance(snap, Snapshot)
            labels = series_labels(name, self.model_name)
            family = HistogramMetricFamily(name, row.doc, labels=list(labels))
            family.add_metric(list(labels.values()), [(_le(b), n) for b, n in snap.buckets], snap.sum)
            yield family
        reasons = REQUEST_SUCCESS.read(figures)
        if reasons is not None:
            labels = series_labels("vllm:request_success", self.model_name)
            family = CounterMetricFamily("vllm:request_success", REQUEST_SUCCESS.doc,
                                         labels=[*labels, "finished_reason"])
            for reason, n in reasons.items():  # type: ignore[attr-defined]
                family.add_metric([*labels.values(), reason], n)
            yield family


def _le(bound: float) -> str:
    """A bucket's ``le`` as prometheus_client writes it (``0.3``, ``1.0``, ``+Inf``), so both kinds read alike."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _InfoCollector:
    """An info gauge: one series, value 1, what it tells in its labels (fixed for the process's life)."""

    def __init__(self, name: str, doc: str, labels: dict[str, str]) -> None:
        self.name, self.doc, self.labels = name, doc, labels

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), 1.0)
        yield family


def cpu_threads_labels(chosen: Allowance) -> dict[str, str]:
    """The info gauge's labels: the count and the bound that won (``source``, as the start-up log's event says)."""
    return {"source": chosen.source, "threads": str(chosen.threads)}


def cache_config_labels(kv_blocks: int, max_seq_len: int, prefix_cache: bool) -> dict[str, str]:
    """vLLM's cache_config_info labels for our KV: the token capacity (scratch block excluded) in router blocks."""
    capacity_tokens = (kv_blocks - 1) * max_seq_len
    return {
        "block_size": str(ROUTER_BLOCK_TOKENS),
        "num_gpu_blocks": str(capacity_tokens // ROUTER_BLOCK_TOKENS),
        "enable_prefix_caching": str(prefix_cache),
        "engine": ENGINE_INDEX,
    }


class ServerMetrics:
    def __init__(self, model_name: str, figures: Figures, cache_config: dict[str, str] | None = None,
                 cpu: Allowance | None = None) -> None:
        """``cpu``: the thread count the process chose at start (the CLI's); a server started without one (in
        process, by a test or a benchmark) decided nothing and exports no ``atom:cpu_threads_info``."""
        self.registry = CollectorRegistry()
        self.registry.register(_StatsCollector(figures, model_name))
        if cache_config is not None:
            self.registry.register(_InfoCollector("vllm:cache_config_info", "Information of the KV cache"
                                                  " configuration.", cache_config))
        if cpu is not None:
            self.registry.register(_InfoCollector("atom:cpu_threads_info", "torch's intra-op threads chosen at start"
                                                  " and the bound that decided them (source).",
                                                  cpu_threads_labels(cpu)))
        self.model_name = model_name
        # The model's series exist from the start (zero counts), as vLLM's do: a scraper or router that reads
        # them before the first request finds them instead of an absent metric.
        self.ttft = self.histogram("vllm:time_to_first_token_seconds", "Time to the first token.",
                                   buckets.TIME_TO_FIRST_TOKEN)
        self.itl = self.histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a request.",
                                  buckets.INTER_TOKEN_LATENCY)
        self.e2e = self.histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.",
                                  buckets.REQUEST_LATENCY)

    def histogram(self, name: str, doc: str, bounds: Sequence[float]) -> Histogram:
        """A latency histogram of this server's model, for a role's own figure (its series exist from the start):
        a ``vllm:`` one with vLLM's bounds (atom_engine.buckets) and labels."""
        labels = series_labels(name, self.model_name)
        h = Histogram(name, doc, list(labels), registry=self.registry, buckets=list(bounds))
        return h.labels(**labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def atom_buckets(low: float, high: float) -> list[float]:
    """The engine's own latency bounds (``atom:`` histograms): ×2.5 from ``low``, ``high`` last."""
    out, b = [], low
    while b < high:
        out.append(round(b, 6))
        b *= 2.5
    return [*out, high]
