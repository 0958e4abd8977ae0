"""The autoscaler's own metrics, on the operator's registry (:mod:`atom_operator.telemetry`: its /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from atom_operator.telemetry import REGISTRY

DESIRED = Gauge("atom_autoscaler_desired_replicas", "Replicas the last decision set, by deployment and role.",
                ["namespace", "name", "role"], registry=REGISTRY)  # fmt: skip
RECOMMENDED = Gauge("atom_autoscaler_recommended_replicas", "Replicas the role's own demand asked for.",
                    ["namespace", "name", "role"], registry=REGISTRY)  # fmt: skip
DEMAND = Gauge("atom_autoscaler_demand", "The demand the last decision read: decode in sequences, prefill in prompt"
               " tokens per second (or busy worker-seconds per second before a worker's speed is known).",
               ["namespace", "name", "role"], registry=REGISTRY)  # fmt: skip
DECISIONS = Counter("atom_autoscaler_decisions_total", "Decisions, by role and direction (up, down, none).",
                    ["role", "direction"], registry=REGISTRY)  # fmt: skip
DRAIN_SECONDS = Histogram("atom_autoscaler_drain_seconds", "From a pod's cordon to its release.", ["role"],
                          buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800), registry=REGISTRY)  # fmt: skip
SCRAPE_ERRORS = Counter("atom_autoscaler_scrape_errors_total", "Pod scrapes that failed or timed out.",
                        registry=REGISTRY)  # fmt: skip
SCRAPE_SECONDS = Histogram("atom_autoscaler_scrape_seconds", "One round of scrapes of one deployment's pods.",
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5), registry=REGISTRY)  # fmt: skip
