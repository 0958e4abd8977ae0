"""From the pods' scrapes to the decision's :class:`~atom_operator.autoscale.observations.Observations`. No I/O.

Gauges are summed over the pods that answered; counters become rates from two scrapes of the same pod (a pod
whose counters went back, i.e. restarted, gives no rate this time). Cordoned pods (draining) take no new work, so
their load is not demand: it is left out, and so is their arrival rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atom_operator.autoscale.arrivals import Counts
from atom_operator.autoscale.observations import DecodeObservation, Observations, PrefillObservation
from atom_operator.autoscale.scrape import Sample

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_FOR_KV = "atom:pd_waiting_for_kv"
ARRIVED_REQUESTS = "atom:arrived_requests_total"
ARRIVED_TOKENS = "atom:arrived_prompt_tokens_total"
ARRIVED_MAX_TOKENS = "atom:arrived_max_tokens_total"
DECODE_SECONDS = "atom:request_decode_seconds_total"
DECODED_MAX_TOKENS = "atom:decoded_max_tokens_total"
BUSY = "atom:prefill_busy_seconds_total"
COMPUTED = "atom:prefill_tokens_computed_total"
TOKENS_WAITING = "atom:prefill_tokens_waiting"
IN_FLIGHT = "atom:requests_in_flight"
ENGINE_IDLE = "atom:engine_idle"


@dataclass(frozen=True)
class PodReading:
    name: str
    ready: bool
    draining: bool
    sample: Sample | None  # this interval's scrape (None: did not answer, or not scraped: not Ready)
    previous: Sample | None = None  # the one before, for rates


@dataclass(frozen=True)
class RoleReading:
    """One role's pods as read this interval, and the Deployment's target (its role is the caller's key)."""

    replicas: int  # the Deployment's target, pods not yet Ready included
    pods: Sequence[PodReading]
    rolling_out: bool = False
    unschedulable: int = 0  # pods the scheduler has not placed for a while (no NPU free)
    newly_unschedulable: int = 0  # pods the scheduler found no node for, not yet for a while
    terminating: int = 0  # pods being deleted, beyond replicas, still holding what they requested


def _rate(pod: PodReading, name: str) -> float | None:
    a, b = pod.previous, pod.sample
    if a is None or b is None or b.time <= a.time or name not in b.values or name not in a.values:
        return None
    delta = b.get(name) - a.get(name)
    return None if delta < 0 else delta / (b.time - a.time)


def _delta(pod: PodReading, name: str) -> float | None:
    a, b = pod.previous, pod.sample
    if a is None or b is None or name not in b.values or name not in a.values:
        return None
    delta = b.get(name) - a.get(name)
    return None if delta < 0 else delta


def _serving(role: RoleReading) -> list[PodReading]:
    return [p for p in role.pods if p.ready and not p.draining]


def _counts(role: RoleReading) -> dict[str, int]:
    serving = _serving(role)
    return {
        "replicas": role.replicas,
        "ready": len(serving),
        "answered": sum(p.sample is not None for p in serving),
        "draining": sum(p.draining for p in role.pods),
        "unschedulable": role.unschedulable,
        "newly_unschedulable": role.newly_unschedulable,
        "terminating": role.terminating,
    }


def _sum_rates(pods: list[PodReading], name: str) -> float | None:
    rates = [r for p in pods if (r := _rate(p, name)) is not None]
    return sum(rates) if rates else None


def _sum_deltas(pods: list[PodReading], name: str) -> float | None:
    deltas = [d for p in pods if (d := _delta(p, name)) is not None]
    return sum(deltas) if deltas else None


def interval_counts(pods: list[PodReading]) -> Counts | None:
    """This interval's arrivals and ended requests over the pods that gave both scrapes (None: none did)."""
    paired = [p for p in pods if _delta(p, ARRIVED_REQUESTS) is not None]
    if not paired:
        return None
    seconds = sum(p.sample.time - p.previous.time for p in paired) / len(paired)  # type: ignore[union-attr]
    if seconds <= 0:
        return None
    return Counts(
        end=max(p.sample.time for p in paired),  # type: ignore[union-attr]
        seconds=seconds,
        requests=_sum_deltas(paired, ARRIVED_REQUESTS) or 0.0,
        prompt_tokens=_sum_deltas(paired, ARRIVED_TOKENS) or 0.0,
        # An engine without these counters (older than the operator) leaves the decision on lane occupancy.
        max_tokens=_sum_deltas(paired, ARRIVED_MAX_TOKENS),
        decode_seconds=_sum_deltas(paired, DECODE_SECONDS) or 0.0,
        decoded_max_tokens=_sum_deltas(paired, DECODED_MAX_TOKENS) or 0.0,
    )


def decode_observation(role: RoleReading, lanes: int | None = None) -> DecodeObservation:
    """``lanes``: a pod's lanes. A request waiting at a pod with a free lane is being admitted at its next step,
    not queued for a lane (None: every waiting request counts as queued)."""
    answered = [p for p in _serving(role) if p.sample is not None]
    full = [p for p in answered if lanes is None or p.sample.get(RUNNING) >= lanes]
    return DecodeObservation(
        **_counts(role),
        rolling_out=role.rolling_out,
        sequences=sum(p.sample.get(RUNNING) + p.sample.get(WAITING) for p in answered),
        running=sum(p.sample.get(RUNNING) for p in answered),
        queued_for_lane=sum(p.sample.get(WAITING) for p in full),
        counts=interval_counts(answered),
        waiting_for_kv=sum(p.sample.get(WAITING_FOR_KV) for p in answered),
        arrived_tokens_per_second=_sum_rates(answered, ARRIVED_TOKENS),
        arrived_requests_per_second=_sum_rates(answered, ARRIVED_REQUESTS),
    )


def prefill_observation(role: RoleReading) -> PrefillObservation:
    answered = [p for p in _serving(role) if p.sample is not None]
    busy = [d for p in answered if (d := _delta(p, BUSY)) is not None]
    computed = [d for p in answered if (d := _delta(p, COMPUTED)) is not None]
    busy_seconds = sum(busy)
    return PrefillObservation(
        **_counts(role),
        rolling_out=role.rolling_out,
        busy_seconds_per_second=_sum_rates(answered, BUSY),
        busy_seconds=busy_seconds,
        tokens_per_busy_second=sum(computed) / busy_seconds if busy_seconds > 0 and computed else None,
        waiting_tokens=sum(p.sample.get(TOKENS_WAITING) for p in answered),
    )


def observations(decode: RoleReading, prefill: RoleReading | None, external_decode: int | None = None,
                 npus: int | None = None, lanes: int | None = None) -> Observations:
    return Observations(
        decode_observation(decode, lanes),
        prefill_observation(prefill) if prefill is not None else None,
        external_decode,
        npus,
    )


def idle(sample: Sample | None) -> bool:
    """Nothing in flight on the pod's API routes (streams included) and, on decode, nothing in the batcher."""
    return sample is not None and sample.get(IN_FLIGHT, 1.0) == 0 and sample.get(ENGINE_IDLE, 1.0) == 1
