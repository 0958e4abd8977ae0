"""What the decision reads each interval: each role's replicas and pods, and what its answering pods reported.

:mod:`.observe` builds these from the scrapes; :mod:`.decision` reads them. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from atom_operator.autoscale.arrivals import Counts


@dataclass(frozen=True)
class RoleObservation:
    """One role this interval: its current replicas (the target, pods not yet Ready included) and its pods."""

    replicas: int
    ready: int
    answered: int  # Ready pods whose metrics were read this interval
    rolling_out: bool = False  # a rollout's ReplicaSets scale proportionally: no victim can be chosen, no shrink
    draining: int = 0
    unschedulable: int = 0  # of replicas, pods the scheduler has not placed for a while
    newly_unschedulable: int = 0  # of replicas, pods the scheduler found no node for, not yet for a while
    terminating: int = 0  # pods being deleted (not in replicas), which hold their NPUs until they are gone


@dataclass(frozen=True)
class DecodeObservation(RoleObservation):
    sequences: float = 0.0  # sum over the answered pods of running + waiting (the interval's mean)
    waiting_for_kv: float = 0.0  # of which lanes only wait for a remote prefill's KV
    arrived_tokens_per_second: float | None = None  # prompt tokens arriving (at enqueue), all decode pods
    arrived_requests_per_second: float | None = None
    running: float | None = None  # lanes held (of sequences), waiting_for_kv included
    queued_for_lane: float = 0.0  # of sequences, requests waiting at pods whose every lane is held
    counts: Counts | None = None  # this interval's arrivals and ended requests, for the window (None: no pair)


@dataclass(frozen=True)
class PrefillObservation(RoleObservation):
    busy_seconds_per_second: float | None = None  # sum over the workers of busy time per second
    busy_seconds: float = 0.0  # busy time the speed below was measured over
    tokens_per_busy_second: float | None = None  # prompt tokens computed per busy second, this window
    waiting_tokens: float = 0.0  # prompt tokens queued at the workers


@dataclass(frozen=True)
class Observations:
    decode: DecodeObservation
    prefill: PrefillObservation | None = None  # None when the deployment has no prefill role
    external_decode: int | None = None  # External mode: spec.decode.replicas as an HPA or KEDA wrote it
    npus: int | None = None  # the cluster's allocatable NPUs, every vendor resource on every node (None: not known)
