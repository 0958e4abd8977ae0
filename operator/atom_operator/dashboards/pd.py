"""The prefill/decode dashboard: the KV transport between a deployment's decode pods and its prefill pool.

The decode pods serve the fetch side (``atom:pd_*``: attempts, retries, failures, the breaker, bytes received,
the remote and local prefills, the B1 prefetches); the prefill workers the sending side (``atom:prefill_*``).
"""

from __future__ import annotations

from atom_operator.dashboards import variables as v
from atom_operator.dashboards.engine import BY, LEGEND, S, counted
from atom_operator.dashboards.grafana import Dashboard, Panel, Target
from atom_operator.dashboards.promql import quantiles, rate, ratio, selector

BREAKER = (("0", "closed"), ("1", "half-open"), ("2", "open"))  # atom:pd_breaker_state's values

PANELS = (
    Panel("Prefill pool breaker", (Target(f"max by (pod) ({selector('atom:pd_breaker_state', S)})", "{{pod}}"),),
          mappings=BREAKER, description="Each decode pod's circuit breaker on its prefill pool: 0 closed, 1"
                                        " half-open (probing), 2 open (fetches fail at once)."),
    Panel("KV fetches", counted(
        ("atom:pd_fetch_attempts_total", "attempts"),
        ("atom:pd_fetch_retries_total", "retried on another worker"),
        ("atom:pd_fetch_failures_total", "failed")),
          "ops", description="Fetch attempts on prefill workers, retries and failed attempts, per second."),
    Panel("KV fetch failure share", (
        Target(ratio("atom:pd_fetch_failures_total", "atom:pd_fetch_attempts_total", S, BY), LEGEND),),
          "percentunit", description="Failed over attempted fetches (the AtomKVFetchFailures alert's ratio)."),
    Panel("Prefills: remote and local", counted(
        ("atom:pd_remote_prefills_total", "remote"),
        ("atom:pd_local_prefills_total", "local (selective PD)")),
          "ops", description="Shipments asked of prefill workers, and prompts a decode pod prefilled itself (a"
                             " short uncached suffix, or the pool down)."),
    Panel("KV bytes", counted(
        ("atom:pd_bytes_received_total", "received (decode)"),
        ("atom:pd_kv_bytes_imported_total", "KV payload imported (decode)"),
        ("atom:prefill_bytes_sent_total", "sent (prefill)")),
          "Bps", description="Bytes per second over the KV transport: all frames read by decode pods, the KV"
                             " payload they imported, the frames prefill workers sent."),
    Panel("Time receiving KV", (Target(rate("atom:pd_transfer_seconds_total", S, "pod"), "{{pod}}"),),
          "s", description="Seconds per second each decode pod spent between a frame's first byte and its last."),
    Panel("Prefill time on decode (with the import)", quantiles("vllm:request_prefill_time_seconds", S, BY, LEGEND),
          "s", description="A lane to the first token: with PD, the remote prefill and the KV import."),
    Panel("Lanes waiting for KV", (
        Target(f"sum by (pod) ({selector('atom:pd_waiting_for_kv', S)})", "{{pod}}"),), description="Decode lanes"
          " held while their prompt's KV is computed on a prefill worker."),
    Panel("Prefill workers: queue and in flight", (
        Target(f"sum by (pod) ({selector('atom:prefill_tokens_waiting', S)})", "{{pod}} tokens waiting"),
        Target(f"sum by (pod) ({selector('atom:prefill_in_flight', S)})", "{{pod}} requests held")),
          description="Prompt tokens queued for each prefill worker, and its requests queued, computing or sending."),
    Panel("Prefill workers: busy", (Target(rate("atom:prefill_busy_seconds_total", S, "pod"), "{{pod}}"),),
          "percentunit", description="Share of the time each prefill worker spent computing."),
    Panel("Prefill workers: lost work", counted(
        ("atom:prefill_sends_failed_total", "sends failed"),
        ("atom:prefills_abandoned_total", "abandoned (decoder left)"),
        ("atom:prefill_leases_expired_total", "leases expired")),
          "ops", description="Frames whose sending failed, prefills stopped because their decoder left, and requests"
                             " dropped because their decoder stopped renewing its lease."),
    Panel("B1 prefetches", counted(
        ("atom:prefetch_started_total", "started"),
        ("atom:prefetch_hits_total", "imported by their lane"),
        ("atom:prefetch_failed_total", "failed")),
          "ops", description="Prefetches started at arrival, those their lane imported, and those whose producer"
                             " failed."),
)

DASHBOARD = Dashboard("atom-pd", "ATOM / Prefill-decode", "The KV transport between decode pods and their prefill"
                      " pool: fetches, the breaker, bytes and the prefill workers.", v.ENGINES, PANELS)
