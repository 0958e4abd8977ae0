"""The reconciler's start and stop, called from the kopf startup handler with the operator's settings."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import aiohttp.web

from atom_operator import metrics
from atom_operator.api import GROUP, KIND
from atom_operator.autoscale.loop import Autoscaler, Fanout
from atom_operator.children.meta import DEPLOYMENT_LABEL
from atom_operator.controller import Controller
from atom_operator.informer import Informer, OwnerOf, controlled_by, itself, labelled
from atom_operator.kube import Kube
from atom_operator.settings import Settings

log = logging.getLogger(__name__)

# What the informers watch: (kind, the cheap filter naming the owner, a label selector sent to the server).
# The children are matched by their controller reference, so one whose label was removed by hand is still seen
# (and the label restored); pods are the ReplicaSets', and carry the label from our pod template.
WATCHED: tuple[tuple[str, OwnerOf, str | None], ...] = (
    ("AtomDeployment", itself, None),
    ("Deployment", controlled_by(KIND, GROUP), None),
    ("ConfigMap", controlled_by(KIND, GROUP), None),
    ("Service", controlled_by(KIND, GROUP), None),
    ("NetworkPolicy", controlled_by(KIND, GROUP), None),
    ("Job", controlled_by(KIND, GROUP), None),  # the compile Jobs of spec.model.compileCache
    ("Pod", labelled(DEPLOYMENT_LABEL), DEPLOYMENT_LABEL),
)


@dataclass
class Runtime:
    controller: Controller
    http: aiohttp.web.AppRunner | None
    informers: list[asyncio.Task[None]] = field(default_factory=list)  # run for as long as the operator
    waiting: asyncio.Task[None] | None = None  # opens the work queue once every informer has listed

    def alive(self) -> bool:
        return self.controller.alive() and all(not t.done() for t in self.informers)

    def ready(self) -> bool:
        return self.controller.synced.is_set()

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.cleanup()
        tasks = [*self.informers, *([self.waiting] if self.waiting else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.controller.stop()


async def start(config: Settings) -> Runtime:
    kube = await Kube.login()
    controller = Controller(kube, config.defaults, workers=config.workers)
    scaler = Autoscaler(kube, controller.owners, lambda ns, name: controller.children.get("Deployment", ns, name),
                        controller.enqueue)  # fmt: skip
    controller.replicas = scaler.replicas
    sink = Fanout(controller, scaler)  # the autoscaler sees the pods as the controller does
    informers = [
        Informer(kube, kind, namespace, owner_of, sink, config.resync_seconds, selector)
        for namespace in (config.namespaces or (None,))
        for kind, owner_of, selector in WATCHED
    ]
    runtime = Runtime(controller, None, [asyncio.create_task(i.run(), name=repr(i)) for i in informers])

    async def open_when_synced() -> None:
        await asyncio.gather(*(i.synced.wait() for i in informers))
        log.info("event=caches_synced informers=%d", len(informers))
        controller.synced.set()
        await scaler.run()  # on the same full view as the reconciler

    runtime.waiting = asyncio.create_task(open_when_synced(), name="wait-for-cache-sync")
    if config.metrics_port:
        runtime.http = await metrics.serve(config.metrics_addr, config.metrics_port, runtime.alive, runtime.ready)
    return runtime
