"""The engine dashboard: what every engine pod serves under vLLM's names, per AtomDeployment and role.

A dashboard written for vLLM reads the same series (docs/observability.md's parity table); the latency
histograms belong to the pod that answers the client (standalone or decode).
"""

from __future__ import annotations

from atom_operator.dashboards import variables as v
from atom_operator.dashboards.grafana import Dashboard, Panel, Target
from atom_operator.dashboards.promql import quantiles, rate, rates, ratio, selector

# The engine dashboards' panels follow the three variables and show a series per AtomDeployment.
BY = "atomdeployment"
LEGEND = "{{atomdeployment}}"
S = v.SELECTED


def counted(*counters: tuple[str, str]) -> tuple[Target, ...]:
    """Counters' rates per deployment, (counter, what it counts) each: the engine dashboards' usual target."""
    return rates(S, BY, LEGEND, *counters)


PANELS = (
    Panel("Time to first token", quantiles("vllm:time_to_first_token_seconds", S, BY, LEGEND), "s", width=8,
          description="From a request's arrival to its first token (vllm:time_to_first_token_seconds)."),
    Panel("Inter-token latency", quantiles("vllm:inter_token_latency_seconds", S, BY, LEGEND), "s", width=8,
          description="Between two outputs of a stream (vllm:inter_token_latency_seconds)."),
    Panel("End-to-end latency", quantiles("vllm:e2e_request_latency_seconds", S, BY, LEGEND), "s", width=8,
          description="From a request's arrival to its last token (vllm:e2e_request_latency_seconds)."),
    Panel("Request phases (p90)", tuple(
        Target(f"histogram_quantile(0.9, {rate(f'vllm:request_{phase}_time_seconds_bucket', S, 'le, ' + BY)})",
               f"{LEGEND} {phase}") for phase in ("queue", "prefill", "decode")), "s",
          description="vLLM's phases: queue (arrival to a lane), prefill (a lane to the first token; with PD the"
                      " remote prefill and the KV import), decode (first token to last)."),
    Panel("Finished requests by reason", (
        Target(rate("vllm:request_success_total", S, f"{BY}, finished_reason"), f"{LEGEND} {{{{finished_reason}}}}"),),
          "reqps", description="vllm:request_success by finished_reason (stop, length, abort: the client left,"
                               " error)."),
    Panel("Requests running and waiting", (
        Target(f"sum by ({BY}, role) ({selector('vllm:num_requests_running', S)})", f"{LEGEND} {{{{role}}}} running"),
        Target(f"sum by ({BY}, role) ({selector('vllm:num_requests_waiting', S)})", f"{LEGEND} {{{{role}}}} waiting")),
          description="Lanes in use and the waiting queue (prefill role: prompts computing and queued)."),
    Panel("KV cache usage", (Target(f"max by (pod) ({selector('vllm:kv_cache_usage_perc', S)})", "{{pod}}"),),
          "percentunit", description="Share of each pod's KV blocks held by lanes (vllm:kv_cache_usage_perc)."),
    Panel("Prefix cache hit rate", (
        Target(ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", S, BY), LEGEND),),
          "percentunit", description="Prompt tokens found in the prefix cache over those looked up."),
    Panel("Tokens per second", counted(
        ("vllm:prompt_tokens_total", "prompt"),
        ("vllm:generation_tokens_total", "generated"),
        ("vllm:prompt_tokens_cached_total", "prompt, not computed")),
          "short", description="Prompt tokens admitted, tokens generated, and prompt tokens copied from the prefix"
                               " cache or imported from a prefill worker (vllm:prompt_tokens_cached)."),
    Panel("Refused and failed requests", counted(
        ("atom:requests_rejected_total", "refused (400/429)"),
        ("atom:requests_failed_total", "failed")),
          "reqps", description="Requests refused before queueing, and requests that ended with an error."),
)

DASHBOARD = Dashboard("atom-engine", "ATOM / Engine", "Latency, load, KV cache and tokens of the engine pods.",
                      v.ENGINES, PANELS)
