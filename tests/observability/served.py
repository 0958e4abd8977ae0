"""What the engine and the operator serve on /metrics: each sample name with the labels its series carry.

The engine's is rendered in process by its own metrics table (``ServerMetrics(...).render()``), handed one of every
stats component a role can have, so every row shows. The operator's is its registry (``atom_operator.telemetry``,
the autoscaler's metrics included) as ``generate_latest`` writes it, after each labelled metric got one series (a
labelled metric has none until its first label set): in a subprocess, so this process's registry, which other
tests read, gets no stray series.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from dataclasses import fields

from atom_engine.cpu_allowance import Allowance
from atom_engine.request_tallies import RequestTallies
from atom_engine.server.metrics import ServerMetrics, cache_config_labels
from atom_engine.stats import (
    BatcherStats,
    ClientStats,
    EngineStats,
    InFlightStats,
    KVStats,
    QueueStats,
    SelectiveStats,
    ServiceStats,
    ServingStats,
    WorkerStats,
)
from prometheus_client.parser import text_string_to_metric_families

Served = dict[str, frozenset[str]]  # sample name (vllm:prompt_tokens_total, ..._bucket) -> its label names

# Every stats component once. SelectiveStats is a RemoteStats (one component may report each class), and
# BatcherStats a BatcherCounters.
FIGURES = (BatcherStats(), KVStats(*[0] * len(fields(KVStats))), RequestTallies(64).stats(), EngineStats(0.0, 1),
           SelectiveStats(), ClientStats(), InFlightStats(), ServingStats(), WorkerStats(), ServiceStats(),
           QueueStats())

OPERATOR_SCRIPT = """
import sys
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase
from atom_operator import telemetry
from atom_operator.autoscale import telemetry as scaling
for module in (telemetry, scaling):
    for metric in vars(module).values():
        if isinstance(metric, MetricWrapperBase) and metric._labelnames:
            metric.labels(*["x"] * len(metric._labelnames))
sys.stdout.write(generate_latest(telemetry.REGISTRY).decode())
"""


def parse(text: str) -> Served:
    out: defaultdict[str, set[str]] = defaultdict(set)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] |= set(sample.labels)
    return {name: frozenset(labels) for name, labels in out.items()}


def engine_text() -> str:
    cpu = Allowance(1, "cpuThreads", (("cpuThreads", 1.0),))
    return ServerMetrics("m", lambda: list(FIGURES), cache_config_labels(4, 64, True), cpu).render().decode()


def engine() -> Served:
    return parse(engine_text())


def operator_text() -> str:
    out = subprocess.run([sys.executable, "-c", OPERATOR_SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def operator() -> Served:
    return parse(operator_text())
