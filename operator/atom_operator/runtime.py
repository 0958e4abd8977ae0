"""The reconciler's configuration (environment) and its start and stop, called from the kopf startup handler.

Environment:
  ATOM_ENGINE_IMAGE, ATOM_ENGINE_IMAGE_PULL_POLICY  what spec.image / spec.imagePullPolicy default to.
  ATOM_ENGINE_RNGD_IMAGE   the image of rngd pods (Dockerfile target engine-rngd), unless prefill.image is set.
  ATOM_NPU_PROFILE         this cluster's NPU resource names and node selectors, as JSON (the chart's `npu` value;
                           see atom_operator.npu); unset: the vendors' defaults (rebellions.ai/npu, furiosa.ai/rngd).
  ATOM_NETWORK_POLICY      true: every AtomDeployment gets NetworkPolicies (children/networkpolicy.py).
  ATOM_RECONCILE_WORKERS   AtomDeployments reconciled at once (default 16; a worker mostly waits on the API
                           server, so this bounds the operator's requests in flight, not its CPU).
  ATOM_METRICS_ADDR/PORT   where /metrics, /healthz and /readyz are served (default 0.0.0.0:8080; port 0: not
                           served).
  ATOM_RESYNC_SECONDS      the longest an informer goes without a complete listing (default 300): a deletion or
                           edit no watch event reported is repaired within it. Every broken watch lists at once.
  ATOM_NAMESPACES          comma-separated namespaces to reconcile in (default: every namespace); match kopf's
                           ``--namespace`` options when you give those.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp.web
import kopf

from atom_operator import metrics
from atom_operator.api import GROUP, KIND
from atom_operator.children import Defaults
from atom_operator.children.meta import DEPLOYMENT_LABEL
from atom_operator.controller import Controller
from atom_operator.informer import Informer, OwnerOf, controlled_by, itself, labelled
from atom_operator.kube import Kube
from atom_operator.npu import NpuProfile

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


@dataclass(frozen=True)
class Config:
    defaults: Defaults
    workers: int
    metrics_addr: str
    metrics_port: int
    resync_seconds: int = 300
    namespaces: tuple[str, ...] = ()  # empty: every namespace

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        base = Defaults()
        return cls(
            defaults=Defaults(
                image=env.get("ATOM_ENGINE_IMAGE") or base.image,
                image_pull_policy=env.get("ATOM_ENGINE_IMAGE_PULL_POLICY") or base.image_pull_policy,
                rngd_image=env.get("ATOM_ENGINE_RNGD_IMAGE") or base.rngd_image,
                npu=NpuProfile.parse(env.get("ATOM_NPU_PROFILE")),
                network_policy=env.get("ATOM_NETWORK_POLICY", "").lower() in ("1", "true", "yes"),
            ),
            workers=int(env.get("ATOM_RECONCILE_WORKERS", "16")),
            metrics_addr=env.get("ATOM_METRICS_ADDR", "0.0.0.0"),
            metrics_port=int(env.get("ATOM_METRICS_PORT", "8080")),
            resync_seconds=int(env.get("ATOM_RESYNC_SECONDS", "300")),
            namespaces=tuple(n.strip() for n in env.get("ATOM_NAMESPACES", "").split(",") if n.strip()),
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


async def start(settings: kopf.OperatorSettings, config: Config | None = None) -> Runtime:
    config = config or Config.from_env()
    kube = await Kube.login(settings)
    controller = Controller(kube, config.defaults, workers=config.workers)
    informers = [
        Informer(kube, kind, namespace, owner_of, controller, config.resync_seconds, selector)
        for namespace in (config.namespaces or (None,))
        for kind, owner_of, selector in WATCHED
    ]
    runtime = Runtime(controller, None, [asyncio.create_task(i.run(), name=repr(i)) for i in informers])

    async def open_when_synced() -> None:
        await asyncio.gather(*(i.synced.wait() for i in informers))
        log.info("event=caches_synced informers=%d", len(informers))
        controller.synced.set()

    runtime.waiting = asyncio.create_task(open_when_synced(), name="wait-for-cache-sync")
    if config.metrics_port:
        runtime.http = await metrics.serve(config.metrics_addr, config.metrics_port, runtime.alive, runtime.ready)
    return runtime
