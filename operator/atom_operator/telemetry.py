"""The operator's Prometheus metrics and its HTTP endpoint: /metrics, /healthz (liveness: the workers and
informers run), /readyz (readiness: and every informer has listed once, so the operator acts on a full view)."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp.web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry()
RECONCILES = Counter(
    "atom_operator_reconciles_total",
    "Reconciles of AtomDeployments, by result (unchanged, changed, retry, error).",
    ["result"],
    registry=REGISTRY,
)
# Each result's series exists from the start at 0, so an alert on rate(...{result="error"}) sees the first error
# (a series born at 1 has no increase to show).
for _result in ("unchanged", "changed", "retry", "error"):
    RECONCILES.labels(_result)
ERRORS = Counter("atom_operator_errors_total", "Reconciles that failed, by kind of error.", ["kind"], registry=REGISTRY)
DURATION = Histogram(
    "atom_operator_reconcile_duration_seconds",
    "Time one reconcile takes.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
WRITES = Counter("atom_operator_child_writes_total", "Children written, by action.", ["action"], registry=REGISTRY)
QUEUE = Gauge("atom_operator_queue_depth", "AtomDeployments waiting to be reconciled.", registry=REGISTRY)
RELISTS = Counter(
    "atom_operator_relists_total",
    "Complete listings by the informers (start, every broken or expired watch, every resync), by kind.",
    ["kind"],
    registry=REGISTRY,
)
OBJECTS = Gauge("atom_operator_atomdeployments", "AtomDeployments the operator watches.", registry=REGISTRY)
# 0 on a standby replica (and before the first election), 1 while this replica holds the Lease: no replica at 1
# means nothing reconciles or autoscales.
LEADER = Gauge("atom_operator_leader", "1 while this replica holds the Lease and reconciles, else 0.",
               registry=REGISTRY)  # fmt: skip

# Each AtomDeployment's status as the operator stores it (atom_operator.deployment_metrics sets and removes them).
# Labelled with the AtomDeployment's own namespace: the ServiceMonitor honours it (honorLabels) over the operator's.
DEPLOYMENT = ["namespace", "atomdeployment"]
CONDITION = Gauge("atom_deployment_condition", "An AtomDeployment's conditions: 1 for each type's current status"
                  " (True, False, Unknown), 0 for the other two.", [*DEPLOYMENT, "type", "status"],
                  registry=REGISTRY)  # fmt: skip
CONDITION_REASON = Gauge("atom_deployment_condition_reason", "1 for the reason of each condition type's current"
                         " status.", [*DEPLOYMENT, "type", "reason"], registry=REGISTRY)  # fmt: skip
REPLICAS = Gauge("atom_deployment_replicas", "An AtomDeployment's pods by role: desired (the spec's count, or the"
                 " autoscaler's) and ready.", [*DEPLOYMENT, "role", "state"], registry=REGISTRY)  # fmt: skip


async def serve(addr: str, port: int, alive: Callable[[], bool], ready: Callable[[], bool]) -> aiohttp.web.AppRunner:
    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        # Alive while the reconcile workers run; a dead worker pool cannot heal itself, so let the kubelet restart.
        return aiohttp.web.Response(text="ok\n") if alive() else aiohttp.web.Response(status=503, text="workers down\n")

    async def readyz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        if not alive():
            return aiohttp.web.Response(status=503, text="workers down\n")
        if not ready():
            return aiohttp.web.Response(status=503, text="caches syncing\n")
        return aiohttp.web.Response(text="ok\n")

    app = aiohttp.web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, addr, port).start()
    return runner
