"""The operator's parts, started and stopped together: the informers and their stores, the controller, the
admission webhook, leader election and /metrics, /healthz, /readyz.

Every replica runs all of them but the controller's workers, which only the Lease's holder starts
(:mod:`atom_operator.lease`): the standby keeps its caches warm and serves the webhook, so it takes over within the
Lease's duration and the webhook answers throughout. Readiness is the caches': a replica is ready (takes webhook
traffic, counts for the PodDisruptionBudget) once every informer has listed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web

from atom_operator import admission, telemetry
from atom_operator.admission import Verdict
from atom_operator.api import GROUP, KIND
from atom_operator.autoscale.loop import Autoscaler, Fanout
from atom_operator.children.meta import DEPLOYMENT_LABEL
from atom_operator.config import Settings
from atom_operator.controller import Controller
from atom_operator.informer import Informer, Key, OwnerOf, controlled_by, itself, labelled
from atom_operator.kube import Kube
from atom_operator.lease import LeaderElector
from atom_operator.store import Stores
from atom_operator.webhook import WebhookServer

log = logging.getLogger(__name__)

# What the controller's informers watch: (kind, the cheap filter naming the owner, a label selector sent to the
# server). The children are matched by their controller reference, so one whose label was removed by hand is still
# seen (and the label restored); pods are the ReplicaSets', and carry the label from our pod template.
WATCHED: tuple[tuple[str, OwnerOf, str | None], ...] = (
    (KIND, itself, None),
    ("Deployment", controlled_by(KIND, GROUP), None),
    ("ConfigMap", controlled_by(KIND, GROUP), None),
    ("Service", controlled_by(KIND, GROUP), None),
    ("NetworkPolicy", controlled_by(KIND, GROUP), None),
    ("Job", controlled_by(KIND, GROUP), None),  # the compile Jobs of spec.model.compileCache
    ("Pod", labelled(DEPLOYMENT_LABEL), DEPLOYMENT_LABEL),
)
EVERY_NODE: Key = ("", "")


def _namespace_of(body: dict[str, Any]) -> Key:
    return body["metadata"]["namespace"], ""


# What the webhook's warnings read: the nodes' NPUs (all under one key; the autoscaler reads them too) and the
# claims (by namespace).
WEBHOOK_WATCHED: tuple[tuple[str, OwnerOf], ...] = (
    ("Node", lambda _: EVERY_NODE),
    ("PersistentVolumeClaim", _namespace_of),
)
WEBHOOK_VIEWS = {
    "Node": lambda node: admission.node_npus((node.get("status") or {}).get("allocatable") or {}),
    "PersistentVolumeClaim": lambda _: True,
}


def cluster_npus(cluster: Stores) -> int:
    """Every vendor NPU the nodes advertise as allocatable: a node joining shows as this growing."""
    return sum(admission.total(cluster["Node"].owned_by(EVERY_NODE).values()).values())


@dataclass
class Runtime:
    controller: Controller
    informers: list[Informer]
    cluster: Stores  # what the webhook reads
    elector: LeaderElector | None = None
    webhook: WebhookServer | None = None
    http: aiohttp.web.AppRunner | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)  # run for as long as the operator
    waiting: asyncio.Task[None] | None = None  # opens the work queue once every informer has listed
    lost: asyncio.Event = field(default_factory=asyncio.Event)  # the Lease was lost: stop writing, stop the process

    def alive(self) -> bool:
        return self.controller.alive() and all(not t.done() for t in self.tasks)

    def ready(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    def review(self, obj: Any, old: Any, namespace: str | None) -> Verdict:
        """The webhook's verdict; the warnings about NPUs and claims only once their informers have listed."""
        synced = self.ready()
        nodes, claims = self.cluster["Node"], self.cluster["PersistentVolumeClaim"]
        return admission.review(
            obj,
            old=old,
            allocatable=admission.total(nodes.owned_by(EVERY_NODE).values()) if synced else None,
            claims=set(claims.owned_by((namespace, ""))) if synced and namespace else None,
            profile=self.controller.defaults.npu,
        )

    async def stop(self) -> None:
        if self.elector is not None:
            await self.controller.stop_working()
            await self.elector.release()
        tasks = [*self.tasks, *([self.waiting] if self.waiting else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.webhook is not None:
            await self.webhook.stop()
        if self.http is not None:
            await self.http.cleanup()
        await self.controller.stop()


async def start(config: Settings) -> Runtime:
    kube = await Kube.login(f"atom-operator/{config.lease.identity}" if config.lease else "atom-operator")
    controller = Controller(kube, config.defaults, workers=config.workers)
    cluster = Stores(WEBHOOK_VIEWS)
    namespaces = config.namespaces or (None,)
    scaler = Autoscaler(kube, controller.stores[KIND].by_key(), controller.stores["Deployment"].get,
                        controller.enqueue, npus=lambda: cluster_npus(cluster))  # fmt: skip
    controller.replicas = scaler.replicas
    controller.scaling = scaler.conditions
    sink = Fanout(controller, scaler)  # the autoscaler sees the pods as the controller does
    informers = [
        Informer(kube, kind, namespace, owner_of, sink, config.resync_seconds, selector)
        for namespace in namespaces
        for kind, owner_of, selector in WATCHED
    ]
    # The nodes' NPUs: the webhook's capacity warning, and the autoscaler's cue that a node joined.
    informers.append(Informer(kube, "Node", None, WEBHOOK_WATCHED[0][1], cluster, config.resync_seconds))
    if config.webhook.enabled:
        informers += [Informer(kube, "PersistentVolumeClaim", namespace, WEBHOOK_WATCHED[1][1], cluster,
                               config.resync_seconds) for namespace in namespaces]
    runtime = Runtime(controller, informers, cluster)
    runtime.tasks = [asyncio.create_task(i.run(), name=repr(i)) for i in informers]

    async def open_when_synced() -> None:
        await asyncio.gather(*(i.synced.wait() for i in informers))
        log.info("event=caches_synced informers=%d", len(informers))
        controller.synced.set()
        await controller.writing.wait()  # only the leader autoscales: it writes pods, replicas and status
        await scaler.run()  # on the same full view as the reconciler

    runtime.waiting = asyncio.create_task(open_when_synced(), name="wait-for-cache-sync")
    if config.lease is None:
        controller.writing.set()
        telemetry.LEADER.set(1)  # the only replica: it leads without a Lease
    else:
        runtime.elector = LeaderElector(kube, config.lease)

        async def lead(elector: LeaderElector) -> None:
            await elector.run(on_leading=controller.writing.set)  # returns when the Lease is lost
            controller.writing.clear()
            if runtime.waiting is not None:
                runtime.waiting.cancel()  # the autoscaler writes nothing more (cancelled before anything is awaited)
            await controller.stop_working()  # nor does a reconcile in flight
            runtime.lost.set()

        runtime.tasks.append(asyncio.create_task(lead(runtime.elector), name="leader-election"))
    if config.webhook.enabled:
        runtime.webhook = WebhookServer(config.webhook, runtime.review)
        await runtime.webhook.start()
    if config.metrics_port:
        runtime.http = await telemetry.serve(config.metrics_addr, config.metrics_port, runtime.alive, runtime.ready)
    return runtime
