"""Prometheus metrics: the vLLM names gateways and dashboards read, plus the engine's own (``atom:``).

Gauges and counters are read from the engine at scrape time (one source of truth, no double counting); the
latency histograms are observed per request by the server. Each server has its own registry, so several can
live in one process (tests).

``vllm:cache_config_info`` is vLLM's info gauge (value 1, the configuration in its labels); the Gateway API
Inference Extension's endpoint picker reads ``block_size`` and ``num_gpu_blocks`` from it to size its prefix
index per pod and to cut prompts into hash blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

Stats = Callable[[], dict[str, float]]

# The prefix granularity reported to routers, in tokens: vLLM's default block size. Our blocks hold a whole
# sequence and the prefix cache reuses any common prefix length, so a router may hash prompts at any
# granularity; reporting maxSeqLen would make every prompt shorter than one hash block, i.e. never matched.
ROUTER_BLOCK_TOKENS = 16

# name -> (kind, stats key, help)
VLLM = {
    "vllm:num_requests_running": ("gauge", "running", "Requests holding a lane (prefill role: prompts computing)."),
    "vllm:num_requests_waiting": ("gauge", "waiting", "Requests in the waiting queue (prefill role: prompts"
                                  " queued for the worker)."),
    "vllm:kv_cache_usage_perc": ("gauge", "kv_usage", "Share of KV blocks (scratch excluded) held by lanes, 0..1."),
    "vllm:prefix_cache_queries": ("counter", "prefix_query_tokens", "Prompt tokens looked up in the prefix cache."),
    "vllm:prefix_cache_hits": ("counter", "prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache."),
    "vllm:prompt_tokens": ("counter", "prompt_tokens", "Prompt tokens of admitted requests."),
    "vllm:generation_tokens": ("counter", "generation_tokens", "Generated tokens."),
    "vllm:spec_decode_num_draft_tokens": ("counter", "draft_tokens", "Draft tokens fed to decode steps."),
    "vllm:spec_decode_num_accepted_tokens": ("counter", "draft_tokens_accepted", "Draft tokens the model agreed"
                                             " with (kept as output)."),
}
ATOM = {
    "atom:kv_blocks_total": ("gauge", "kv_blocks", "KV blocks compiled in (kvBlocks)."),
    "atom:kv_blocks_free": ("gauge", "free_blocks", "Free KV blocks."),
    "atom:kv_blocks_cached": ("gauge", "cached_blocks", "KV blocks held by prefix-cache entries."),
    "atom:kv_blocks_lanes": ("gauge", "lane_blocks", "KV blocks held by lanes."),
    "atom:kv_blocks_pinned": ("gauge", "pinned_blocks", "Prefix-cache entries pinned as copy sources."),
    "atom:cpu_threads": ("gauge", "cpu_threads", "torch's intra-op threads (from cpuThreads or the container's CPU"
                         " allowance; the start-up log says which)."),
    "atom:engine_idle": ("gauge", "idle", "1 when the batcher reports no work (no request, no held prefetch)."),
    "atom:pd_source_slots_held": ("gauge", "slots_held", "PD source slots reserved."),
    "atom:requests_finished": ("counter", "requests_finished", "Requests that ended with stop or length."),
    "atom:requests_cancelled": ("counter", "requests_cancelled", "Requests cancelled (client gone)."),
    "atom:requests_failed": ("counter", "requests_failed", "Requests that ended with an error."),
    "atom:requests_rejected": ("counter", "requests_rejected", "Requests refused before queueing (400/429)."),
    "atom:prefill_tokens_computed": ("counter", "prefill_tokens_computed", "Prompt tokens prefilled here."),
    "atom:pd_remote_prefills": ("counter", "remote_prefills", "Shipments requested from prefill workers."),
    "atom:pd_remote_prefill_tokens": ("counter", "remote_prefill_tokens", "Prompt tokens whose KV was imported."),
    "atom:pd_local_prefills": ("counter", "selective_local_prefills", "Prompts a decode pod with prefill workers"
                               " prefilled itself (selective PD: a short uncached suffix, or the pool down)."),
    "atom:pd_kv_bytes_imported": ("counter", "kv_bytes_imported", "Payload bytes of imported shipments."),
    "atom:pd_bytes_received": ("counter", "pd_bytes_received", "Bytes read from prefill workers (all frames)."),
    "atom:pd_transfer_seconds": ("counter", "pd_transfer_seconds", "Time from a frame's first byte to its last."),
    "atom:pd_fetch_attempts": ("counter", "pd_attempts", "Fetch attempts on prefill workers."),
    "atom:pd_fetch_retries": ("counter", "pd_retries", "Fetches retried on another worker."),
    "atom:pd_fetch_failures": ("counter", "pd_failures", "Failed fetch attempts."),
    "atom:pd_breaker_state": ("gauge", "pd_breaker_state", "The prefill pool's circuit breaker: 0 closed, 1 half-open,"
                              " 2 open (fetches fail at once)."),
    "atom:pd_breaker_transitions": ("counter", "pd_breaker_transitions", "Moves of the prefill pool's breaker."),
    "atom:prefetch_started": ("counter", "prefetch_started", "B1 prefetches started."),
    "atom:prefetch_hits": ("counter", "prefetch_hits", "Prefetched shipments imported by their lane."),
    "atom:prefetch_cancelled": ("counter", "prefetch_cancelled", "Prefetched requests cancelled before import."),
    "atom:prefetch_failed": ("counter", "prefetch_failed", "Prefetches whose producer failed."),
    "atom:prefetch_cached_tokens": ("counter", "prefetch_cached_tokens", "Prompt tokens prefetches did not ship."),
    "atom:prefetch_ready": ("gauge", "prefetch_ready", "1 while a prefetched shipment waits for its lane."),
    "atom:prefill_requests": ("counter", "prefill_requests", "Prefill requests received (prefill role)."),
    "atom:prefill_bytes_sent": ("counter", "prefill_bytes_sent", "Frame bytes sent (prefill role)."),
    "atom:prefill_sends_started": ("counter", "prefill_sends_started", "Frames whose sending began."),
    "atom:prefill_sends_failed": ("counter", "prefill_sends_failed", "Frames whose sending failed."),
    "atom:prefill_in_flight": ("gauge", "prefill_in_flight", "Prefill requests held: queued, computing or sending."),
    "atom:prefills_abandoned": ("counter", "prefills_abandoned", "Prefills stopped because their decoder left."),
    "atom:prefill_leases_expired": ("counter", "prefill_leases_expired", "Requests dropped: their decoder stopped"
                                    " renewing its lease (no heartbeat)."),
    # What an autoscaler reads (atom_engine.server.load, the batcher's arrivals).
    "atom:requests_in_flight": ("gauge", "requests_in_flight", "Requests not yet finished, on the API"
                                " routes and the KV transport (streams included): 0 is idle."),
    "atom:arrived_requests": ("counter", "arrived_requests", "Requests queued (at arrival, before a lane)."),
    "atom:arrived_prompt_tokens": ("counter", "arrived_prompt_tokens", "Prompt tokens of queued requests."),
    "atom:pd_waiting_for_kv": ("gauge", "waiting_for_kv", "Lanes held while their prompt's KV is computed remotely."),
    "atom:prefill_tokens_waiting": ("gauge", "prefill_tokens_waiting", "Prompt tokens queued for the prefill"
                                    " worker."),
    "atom:prefill_busy_seconds": ("counter", "prefill_busy_seconds", "Time the prefill worker spent computing."),
}


class _StatsCollector:
    def __init__(self, stats: Stats, model_name: str) -> None:
        self.stats, self.model_name = stats, model_name

    def collect(self) -> Iterator[Metric]:
        values = self.stats()
        for name, (kind, key, doc) in {**VLLM, **ATOM}.items():
            if key not in values:
                continue
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(values[key]))
            yield family


class _CacheConfigCollector:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("vllm:cache_config_info", "Information of the KV cache configuration.",
                                   labels=list(self.labels))
        family.add_metric(list(self.labels.values()), 1.0)
        yield family


def cache_config_labels(kv_blocks: int, max_seq_len: int, prefix_cache: bool) -> dict[str, str]:
    """vLLM's cache_config_info labels for our KV: the token capacity (scratch block excluded) in router blocks."""
    capacity_tokens = (kv_blocks - 1) * max_seq_len
    return {
        "block_size": str(ROUTER_BLOCK_TOKENS),
        "num_gpu_blocks": str(capacity_tokens // ROUTER_BLOCK_TOKENS),
        "enable_prefix_caching": str(prefix_cache),
    }


class ServerMetrics:
    def __init__(self, model_name: str, stats: Stats, cache_config: dict[str, str] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StatsCollector(stats, model_name))
        if cache_config is not None:
            self.registry.register(_CacheConfigCollector(cache_config))
        self.model_name = model_name
        labels = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to the first token.", labels,
                              registry=self.registry, buckets=_buckets(0.001, 60.0))
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a request.", labels,
                             registry=self.registry, buckets=_buckets(0.0005, 5.0))
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.", labels,
                             registry=self.registry, buckets=_buckets(0.005, 300.0))
        # The model's series exist from the start (zero counts), as vLLM's do: a scraper or router that reads
        # them before the first request finds them instead of an absent metric.
        for histogram in (self.ttft, self.itl, self.e2e):
            histogram.labels(model_name=model_name)

    def histogram(self, name: str, doc: str, low: float, high: float) -> Histogram:
        """A latency histogram of this server's model, for a role's own figure (its series exist from the start)."""
        h = Histogram(name, doc, ["model_name"], registry=self.registry, buckets=_buckets(low, high))
        return h.labels(model_name=self.model_name)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _buckets(low: float, high: float) -> list[float]:
    out, b = [], low
    while b < high:
        out.append(round(b, 6))
        b *= 2.5
    return [*out, high]
