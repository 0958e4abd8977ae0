"""One engine process as an aiohttp application, per role.

- ``standalone`` and ``decode``: the OpenAI routes; with ``localPrefill: false`` prompts are prefilled by the
  workers in ``prefillWorkers`` (remote-only PD), else locally.
- ``prefill``: ``POST /v1/kv/prefill`` for decode pods.

Every role has ``/health`` (liveness: 200 while loading or serving, 503 once the engine loop died),
``/ready`` (200 once the model is loaded and warmed) and ``/metrics``. The model loads in a thread after the
server is listening, so the probes answer during a long load.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from aiohttp import web

from atom_engine.settings import EngineSettings, Role

log = logging.getLogger("atom_engine.server")


class EngineServer:
    def __init__(self, settings: EngineSettings, role: Role) -> None:
        self.settings, self.role = settings, role
        self.engine: Any = None  # LLMEngine (standalone/decode)
        self.aengine: Any = None  # AsyncEngine
        self.client: Any = None  # PrefillClient (remote decode)
        self.worker: Any = None  # PrefillWorker (prefill)
        self.service: Any = None  # PrefillService (prefill)
        self.routes: Any = None  # OpenAIRoutes
        self.ready = asyncio.Event()
        self.draining = False  # SIGTERM received: /ready answers 503 while requests are still served
        self.load_error: str | None = None
        self._load_task: asyncio.Task | None = None
        from atom_engine.server.metrics import ServerMetrics, cache_config_labels

        cache = cache_config_labels(settings.kv_blocks, settings.max_seq_len, settings.prefix_cache)
        self.metrics = ServerMetrics(settings.model_name, self.stats, cache)

    # -- the application --------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[_json_errors])
        app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/ready", self.readiness),
                web.get("/metrics", self.metrics_route),
            ]
        )
        if self.role == "prefill":
            app.add_routes([web.post("/v1/kv/prefill", self._delegate("service", "prefill"))])
        else:
            app.add_routes(
                [
                    web.post("/v1/completions", self._delegate("routes", "completions")),
                    web.post("/v1/chat/completions", self._delegate("routes", "chat")),
                    web.get("/v1/models", self._delegate("routes", "models")),
                    web.post("/tokenize", self._delegate("routes", "tokenize")),
                    web.post("/detokenize", self._delegate("routes", "detokenize")),
                    web.get("/tokenizer_info", self._delegate("routes", "tokenizer_info")),
                ]
            )
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    def _delegate(self, holder: str, method: str) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            target = getattr(self, holder)
            if target is None:
                from atom_engine.server.errors import error_response

                return error_response(
                    503, "the engine is still loading; retry when /ready answers 200", code="not_ready"
                )
            return await getattr(target, method)(request)

        return handler

    async def _startup(self, _app: web.Application) -> None:
        self._load_task = asyncio.create_task(self._load())

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self.role == "prefill":
                await self._load_prefill(loop)
            else:
                await self._load_openai(loop)
            self.ready.set()
            log.info("event=ready role=%s model=%s", self.role, self.settings.model_name)
        except Exception as exc:  # noqa: BLE001 - reported on /health and in the log; the probe restarts us
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("event=load_failed role=%s error=%r", self.role, self.load_error)

    async def _load_prefill(self, loop: asyncio.AbstractEventLoop) -> None:
        from atom_engine.pd.faults import Faults
        from atom_engine.pd.prefill_server import PrefillService
        from atom_engine.pd.worker import PrefillWorker

        worker = await loop.run_in_executor(None, PrefillWorker, self.settings)
        await loop.run_in_executor(None, worker.warm)
        self.worker = worker
        self.service = PrefillService(
            worker, send_timeout=self.settings.pd_send_timeout_seconds, faults=Faults.from_env()
        )

    async def _load_openai(self, loop: asyncio.AbstractEventLoop) -> None:
        from atom_engine.engine import LLMEngine
        from atom_engine.server.engine_loop import AsyncEngine
        from atom_engine.server.openai_routes import OpenAIRoutes

        s = self.settings
        remote = None
        if not s.local_prefill:
            from atom_engine.pd.client import PrefillClient, Timeouts
            from atom_engine.pd.remote import RemotePrefill

            assert s.prefill_workers, "settings validation requires prefillWorkers without local prefill"
            self.client = PrefillClient(
                s.prefill_workers,
                attempts=s.pd_attempts,
                unavailable_wait=s.pd_unavailable_wait_seconds,
                resolve_interval=s.pd_resolve_interval_seconds,
                timeouts=Timeouts(
                    s.pd_connect_timeout_seconds,
                    s.pd_response_timeout_seconds,
                    s.pd_read_timeout_seconds,
                    s.pd_total_timeout_seconds,
                ),
            )
            await self.client.start()
            remote = RemotePrefill(self.client, loop)
        engine = await loop.run_in_executor(None, lambda: LLMEngine(s, remote=remote))
        await loop.run_in_executor(None, _warm, engine)
        self.engine = engine
        self.aengine = AsyncEngine(engine, loop)
        if remote is not None:
            remote.configure(engine.model, wakeup=self.aengine.wakeup.set)
        self.aengine.start()
        self.routes = OpenAIRoutes(engine, self.aengine, self.metrics)

    async def _cleanup(self, _app: web.Application) -> None:
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        if self.aengine is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.aengine.stop)
        if self.client is not None:
            await self.client.close()
        if self.service is not None:
            self.service.executor.shutdown(wait=False, cancel_futures=True)

    # -- probes and metrics -----------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        if self.load_error is not None:
            return web.json_response({"status": "dead", "error": self.load_error}, status=503)
        if self.aengine is not None and not self.aengine.alive:
            return web.json_response({"status": "dead", "error": self.aengine.error}, status=503)
        return web.json_response({"status": "ok" if self.ready.is_set() else "loading"})

    async def readiness(self, _request: web.Request) -> web.Response:
        alive = self.aengine is None or self.aengine.alive
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if self.ready.is_set() and alive:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready"}, status=503)

    async def metrics_route(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.engine is not None:
            e = self.engine
            st = e.stats()
            usable = max(1, st["kv_blocks"] - 1)
            out.update(st)
            out["kv_usage"] = st["lane_blocks"] / usable
            out["prefix_query_tokens"] = st["prompt_tokens"] if e.settings.prefix_cache else 0
            out["prefix_cache_hit_tokens"] = st["prefix_cache_hit_tokens"]
            out["pinned_blocks"] = len(e.kv.pins)
            out["idle"] = 0.0 if e.has_unfinished() else 1.0
            remote = hasattr(e.batcher, "slots_held")
            out["slots_held"] = e.batcher.slots_held() if remote else 0
            out["prefetch_ready"] = 1.0 if remote and e.batcher.prefetch_ready() else 0.0
            out["requests_rejected"] = self.routes.rejected if self.routes is not None else 0
        if self.client is not None:
            c = self.client.stats
            out.update(
                pd_bytes_received=c.bytes_received,
                pd_transfer_seconds=c.transfer_seconds,
                pd_attempts=c.attempts,
                pd_retries=c.retries,
                pd_failures=sum(c.failures.values()),
            )
        if self.worker is not None:
            w, sv = self.worker, self.service
            counts = w.kv.counts()
            out.update(
                kv_blocks=w.kv.kv_blocks,
                free_blocks=counts["free"],
                cached_blocks=counts["cached"],
                lane_blocks=counts["lanes"],
                prefill_tokens_computed=w.counters["prefill_tokens_computed"],
                prefill_requests=sv.counters["requests"],
                prefill_bytes_sent=sv.counters["bytes_sent"],
                prefill_sends_started=sv.counters["sends_started"],
                prefill_sends_failed=sv.counters["sends_failed"],
            )
        return out


def _warm(engine: Any) -> None:
    """Run the graphs once before serving, so the first request does not pay for it. Decode writes into a
    free block (its contents mean nothing until a prefill or import overwrites them), prefill into scratch."""
    from atom_engine.kv_blocks import SCRATCH_BLOCK
    from atom_engine.sequence import SamplingParams, Sequence

    probe = Sequence("warm-up", [0], SamplingParams(max_tokens=1), block=engine.kv.free[0])
    engine.runner.decode([probe] + [None] * (engine.settings.lanes - 1))
    if engine.settings.local_prefill:
        engine.runner.prefill_logits(SCRATCH_BLOCK, 0, [0])


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Unknown routes and methods get OpenAI-style JSON errors too; unexpected exceptions a 500."""
    from atom_engine.server.errors import error_response

    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, f"{request.method} {request.path}: {exc.reason}")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001
        log.exception("event=handler_error path=%s", request.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


async def start_server(
    settings: EngineSettings, role: Role, host: str, port: int
) -> tuple[EngineServer, web.AppRunner, int]:
    """Listen on host:port (0: a free port); the model loads in the background (see ``server.ready``)."""
    server = EngineServer(settings, role)
    # handler_cancellation: a client that disconnects cancels its handler, which cancels its request.
    # shutdown_timeout: how long cleanup lets in-flight requests finish after the listener closed.
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None,
                           shutdown_timeout=settings.finish_seconds)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    log.info("event=listening role=%s host=%s port=%d", role, host, bound)
    return server, runner, bound


async def start_metrics(server: EngineServer, host: str, port: int) -> web.AppRunner:
    """A second listener with only /metrics, for the pod's ``metrics`` port (scrapers stay off the API port)."""
    app = web.Application()
    app.add_routes([web.get("/metrics", server.metrics_route)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("event=metrics_listening host=%s port=%d", host, runner.addresses[0][1])
    return runner


async def serve(settings: EngineSettings, role: Role, host: str, port: int, metrics_port: int | None = None) -> None:
    """Run until SIGTERM or SIGINT, then shut down without failing requests.

    1. Drain for ``drainSeconds``: /ready answers 503 and every request is still served. A pod being deleted is
       dropped from its Service's endpoints (and prefill workers from the headless name) only after the API
       server, the endpoint controller, kube-proxy and DNS have caught up; closing the listener at once would
       refuse the connections still routed here meanwhile. A second signal ends the drain early.
    2. Close the listeners and let in-flight requests finish, for up to ``finishSeconds``; then stop the engine.
    The pod's terminationGracePeriodSeconds covers both (see the operator's workload).
    """
    server, runner, _port = await start_server(settings, role, host, port)
    metrics = await start_metrics(server, host, metrics_port) if metrics_port else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    stop.clear()
    server.draining = True
    log.info("event=draining role=%s seconds=%g", role, settings.drain_seconds)
    try:
        await asyncio.wait_for(stop.wait(), settings.drain_seconds)
    except TimeoutError:
        pass
    log.info("event=stopping role=%s", role)
    await runner.cleanup()
    if metrics is not None:
        await metrics.cleanup()
    log.info("event=stopped role=%s", role)
