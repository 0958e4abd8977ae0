"""The reconciler's configuration (environment) and its start and stop, called from the kopf startup handler.

Environment:
  ATOM_ENGINE_IMAGE, ATOM_ENGINE_IMAGE_PULL_POLICY  what spec.image / spec.imagePullPolicy default to.
  ATOM_ENGINE_RNGD_IMAGE   the image of rngd pods (Dockerfile target engine-rngd), unless prefill.image is set.
  ATOM_NPU_PROFILE         this cluster's NPU resource names and node selectors, as JSON (the chart's `npu` value;
                           see atom_engine.api.npu); unset: the vendors' defaults (rebellions.ai/npu, furiosa.ai/rngd).
  ATOM_RECONCILE_WORKERS   AtomDeployments reconciled at once (default 16; a worker mostly waits on the API
                           server, so this bounds the operator's requests in flight, not its CPU).
  ATOM_METRICS_ADDR/PORT   where /metrics and /healthz are served (default 0.0.0.0:8080; port 0: not served).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp.web
import kopf
from atom_engine.api import NpuProfile

from atom_operator import metrics
from atom_operator.children import Defaults
from atom_operator.controller import Controller
from atom_operator.kube import Kube


@dataclass(frozen=True)
class Config:
    defaults: Defaults
    workers: int
    metrics_addr: str
    metrics_port: int

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
            ),
            workers=int(env.get("ATOM_RECONCILE_WORKERS", "16")),
            metrics_addr=env.get("ATOM_METRICS_ADDR", "0.0.0.0"),
            metrics_port=int(env.get("ATOM_METRICS_PORT", "8080")),
        )


@dataclass
class Runtime:
    controller: Controller
    http: aiohttp.web.AppRunner | None

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.cleanup()
        await self.controller.stop()


async def start(settings: kopf.OperatorSettings, config: Config | None = None) -> Runtime:
    config = config or Config.from_env()
    controller = Controller(await Kube.login(settings), config.defaults, workers=config.workers)
    http = None
    if config.metrics_port:
        http = await metrics.serve(config.metrics_addr, config.metrics_port, controller.alive)
    return Runtime(controller, http)
