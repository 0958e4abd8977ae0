"""The autoscaler's own metrics, on the operator's registry (:mod:`atom_operator.telemetry`: its /metrics)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from atom_operator.children.meta import ROLES
from atom_operator.telemetry import DEPLOYMENT, REGISTRY

DESIRED = Gauge("atom_autoscaler_desired_replicas", "Replicas the last decision set, by deployment and role.",
                [*DEPLOYMENT, "role"], registry=REGISTRY)  # fmt: skip
RECOMMENDED = Gauge("atom_autoscaler_recommended_replicas", "Replicas the role's own demand asked for.",
                    [*DEPLOYMENT, "role"], registry=REGISTRY)  # fmt: skip
DEMAND = Gauge("atom_autoscaler_demand", "The demand the last decision read: decode in sequences, prefill in prompt"
               " tokens per second (or busy worker-seconds per second before a worker's speed is known).",
               [*DEPLOYMENT, "role"], registry=REGISTRY)  # fmt: skip
DECISIONS = Counter("atom_autoscaler_decisions_total", "Decisions, by role and direction (up, down, none).",
                    ["role", "direction"], registry=REGISTRY)  # fmt: skip
DRAIN_SECONDS = Histogram("atom_autoscaler_drain_seconds", "From a pod's cordon to its release.", ["role"],
                          buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800), registry=REGISTRY)  # fmt: skip
SCRAPE_ERRORS = Counter("atom_autoscaler_scrape_errors_total", "Pod scrapes that failed or timed out.",
                        registry=REGISTRY)  # fmt: skip
SCRAPE_SECONDS = Histogram("atom_autoscaler_scrape_seconds", "One round of scrapes of one deployment's pods.",
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5), registry=REGISTRY)  # fmt: skip
# Born at 0 for each autoscaled role (:func:`watch`): a series born at 1 shows no increase, and the first timeout
# would not alert.
DRAIN_TIMEOUTS = Counter("atom_autoscaler_drain_timeouts_total", "Drained pods released still busy, after"
                         " autoscaling.drain.timeoutSeconds.", [*DEPLOYMENT, "role"], registry=REGISTRY)  # fmt: skip
PER_ROLE = (DESIRED, RECOMMENDED, DEMAND, DRAIN_TIMEOUTS)


def watch(key: tuple[str, str], roles: Iterable[str]) -> None:
    """The drain timeouts' series of an autoscaled deployment's roles, at 0 until the first."""
    for role in roles:
        DRAIN_TIMEOUTS.labels(*key, role)


def forget(key: tuple[str, str]) -> None:
    """Every series of a deployment no longer autoscaled (deleted, or autoscaling off): none is left stale."""
    for metric in PER_ROLE:
        for role in ROLES:
            metric.remove(*key, role)
