"""One engine process as an aiohttp application, per role: an :class:`OpenAIServer` or a :class:`PrefillServer`,
both :class:`EngineServer` (the probes, the metrics, the background load and the drain they share).

- ``standalone`` and ``decode``: the OpenAI routes; with ``localPrefill: false`` prompts are prefilled by the
  workers in ``prefillWorkers`` (remote-only PD: the engine's KV connector), else locally.
- ``prefill``: the KV transport's port (``pdKvPort``) for decode pods (:mod:`atom_engine.server.prefill_service`).

Every role has ``/health`` (liveness: 200 while loading or serving, 503 once the engine loop died),
``/ready`` (200 once the model is loaded and warmed) and ``/metrics``. The model loads after the server is
listening, so the probes answer during a long load; until then the role's routes answer 503. All model work (load,
warm-up, steps, prefills) runs in the server's one compute thread (:mod:`atom_engine.server.compute` says why).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING, Any

from aiohttp import web

from atom_engine import buckets
from atom_engine.server.compute import ComputeThread
from atom_engine.server.error_responses import error_response
from atom_engine.server.load import InFlight, PrefillQueue, TimedFetches
from atom_engine.server.metrics import ServerMetrics, atom_buckets, cache_config_labels
from atom_engine.server.openai_routes import OpenAIRoutes
from atom_engine.server.prefill_service import PrefillService
from atom_engine.settings import EngineSettings, Role
from atom_engine.stats import InFlightStats, ServingStats

if TYPE_CHECKING:
    from atom_engine.cpu_allowance import Allowance
    from atom_engine.engine import LLMEngine
    from atom_engine.pd.client import PrefillClient
    from atom_engine.pd.tcp import TcpServer
    from atom_engine.pd.worker import PrefillWorker
    from atom_engine.server.engine_loop import AsyncEngine

log = logging.getLogger("atom_engine.server")
COMPUTE_JOIN_SECONDS = 5.0  # how long cleanup waits for the compute thread to end (it is idle by then)
Routes = tuple[tuple[str, str, str], ...]  # (method, path, handler name) of the role's component


class EngineServer:
    """What every role's server has; a role adds its routes (``ROUTES``, served by :meth:`handler`), its load
    and its figures."""

    ROUTES: Routes = ()

    def __init__(self, settings: EngineSettings, role: Role, cpu: Allowance | None = None) -> None:
        """``cpu``: the threads the process chose at start (:func:`atom_engine.cpu_allowance.apply`), for
        /metrics; the chooser stays the CLI, so a server in a test process shows no choice it did not make."""
        self.settings, self.role = settings, role
        self.host = "0.0.0.0"  # noqa: S104 - where the role's own listeners bind (start_server sets it)
        self.ready = asyncio.Event()
        self.draining = False  # SIGTERM received: /ready answers 503 while requests are still served
        self.load_error: str | None = None
        self._load_task: asyncio.Task | None = None
        self.compute = ComputeThread()  # every torch call of this server runs here
        cache = cache_config_labels(settings.kv_blocks, settings.max_seq_len, settings.prefix_cache)
        self.in_flight = InFlight()
        self.metrics = ServerMetrics(settings.model_name, self.stats, cache, cpu)

    # -- what a role provides ---------------------------------------------------------------------
    def handler(self) -> Any | None:
        """The loaded component whose methods serve ``ROUTES`` (None while loading)."""
        return None

    async def load(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load the model and build the role's components (heavy work in threads)."""

    async def close(self) -> None:
        """Stop what load started."""

    def dead(self) -> str | None:
        """Why the role can serve nothing more once loaded (None: it can)."""
        return None

    def stats(self) -> list[object]:
        """The figures /metrics shows: each component's own stats object (:mod:`atom_engine.stats`)."""
        return [self.in_flight.stats()]

    # -- the application --------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.in_flight.middleware, _json_errors])
        app.add_routes([web.get("/health", self.health), web.get("/ready", self.readiness),
                        web.get("/metrics", self.metrics_route)])
        app.add_routes([web.route(method, path, self._delegate(name)) for method, path, name in self.ROUTES])
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    def _delegate(self, name: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            target = self.handler()
            if target is None:
                return error_response(
                    503, "the engine is still loading; retry when /ready answers 200", code="not_ready"
                )
            return await getattr(target, name)(request)

        return handle

    async def _startup(self, _app: web.Application) -> None:
        self._load_task = asyncio.create_task(self._load())

    async def _load(self) -> None:
        try:
            await self.load(asyncio.get_running_loop())
            self.ready.set()
            log.info("event=ready role=%s model=%s", self.role, self.settings.model_name)
        except Exception as exc:  # noqa: BLE001 - reported on /health and in the log; the probe restarts us
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("event=load_failed role=%s error=%r", self.role, self.load_error)

    async def _cleanup(self, _app: web.Application) -> None:
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        await self.close()
        self.compute.shutdown(wait=False, cancel_futures=True)
        # Let an idle compute thread end before the interpreter finalizes: a daemon thread that wakes during
        # finalization is ended inside whatever C++ call it was returning from, and the process aborts. Bounded:
        # a step that never returns must not keep a dying server alive.
        await asyncio.to_thread(self.compute.thread.join, COMPUTE_JOIN_SECONDS)

    # -- probes and metrics -----------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        error = self.load_error if self.load_error is not None else self.dead()
        if error is not None:
            return web.json_response({"status": "dead", "error": error}, status=503)
        return web.json_response({"status": "ok" if self.ready.is_set() else "loading"})

    async def readiness(self, _request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if self.ready.is_set() and self.dead() is None:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready"}, status=503)

    async def metrics_route(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})


class OpenAIServer(EngineServer):
    """``standalone`` and ``decode``: the engine, its loop in the compute thread, and the OpenAI routes."""

    ROUTES = OpenAIRoutes.ROUTES

    def __init__(self, settings: EngineSettings, role: Role, cpu: Allowance | None = None) -> None:
        super().__init__(settings, role, cpu)
        self.engine: LLMEngine | None = None
        self.aengine: AsyncEngine | None = None
        self.client: PrefillClient | None = None  # remote-only PD: the prefill workers' client
        self.routes: OpenAIRoutes | None = None

    def handler(self) -> OpenAIRoutes | None:
        return self.routes

    async def load(self, loop: asyncio.AbstractEventLoop) -> None:
        from atom_engine.engine import LLMEngine
        from atom_engine.server.engine_loop import AsyncEngine

        s = self.settings
        pool = None
        if s.prefill_workers:  # remote-only PD, or selective with localPrefill: the engine builds its connector
            from atom_engine.pd.client import PrefillClient
            from atom_engine.pd.connectors import PrefillPool
            from atom_engine.pd.transport import Timeouts

            self.client = PrefillClient(
                s.prefill_workers, attempts=s.pd_attempts, unavailable_wait=s.pd_unavailable_wait_seconds,
                resolve_interval=s.pd_resolve_interval_seconds,
                timeouts=Timeouts(s.pd_connect_timeout_seconds, s.pd_response_timeout_seconds,
                                  s.pd_read_timeout_seconds, s.pd_total_timeout_seconds, s.pd_lease_seconds),
            )
            await self.client.start()
            fetch_seconds = self.metrics.histogram("atom:pd_fetch_seconds", "A prompt's remote prefill as decode"
                                                   " waits for it: the worker's queue, compute and transfer.",
                                                   atom_buckets(0.001, 300.0))
            pool = PrefillPool(TimedFetches(self.client, fetch_seconds.observe), loop)
        engine = await loop.run_in_executor(self.compute, lambda: LLMEngine(s, prefill_pool=pool))
        await loop.run_in_executor(self.compute, engine.warm)
        # Drafts are verified only where the backend can (cpu): say what this engine actually does.
        log.info("event=engine_loaded speculative_tokens=%d", engine.speculative_tokens)
        self.engine = engine
        self.aengine = AsyncEngine(engine, loop, self.compute)
        self.aengine.start()
        self.routes = OpenAIRoutes(engine, self.aengine, self.metrics)

    async def close(self) -> None:
        if self.aengine is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.aengine.stop)
        if self.engine is not None and not (self.aengine is not None and self.aengine.alive):
            self.engine.close()  # not under a loop that is still stepping (a step that never returned)
        if self.client is not None:
            await self.client.close()

    def dead(self) -> str | None:
        if self.aengine is not None and not self.aengine.alive:
            return self.aengine.error
        return None

    def stats(self) -> list[object]:
        out = super().stats()
        if self.engine is not None:
            # Without PD the connector's gauges read 0 (ServingStats); with it, the connector's own.
            out.append(ServingStats(requests_rejected=self.routes.rejected if self.routes is not None else 0))
            out += self.engine.figures()
        if self.client is not None:
            out.append(self.client.figures())
        return out


class PrefillServer(EngineServer):
    """``prefill``: a prefill worker (the model, one prompt at a time) serving decode pods on its KV port
    (``pdKvPort``, the plain-TCP KV transport), which opens once the model is loaded."""

    def __init__(self, settings: EngineSettings, role: Role = "prefill", cpu: Allowance | None = None) -> None:
        super().__init__(settings, role, cpu)
        self.worker: PrefillWorker | None = None
        self.service: PrefillService | None = None
        self.kv_server: TcpServer | None = None
        self.queue: PrefillQueue | None = None

    def handler(self) -> PrefillService | None:
        return self.service

    async def load(self, loop: asyncio.AbstractEventLoop) -> None:
        from atom_engine.pd.tcp import TcpServer
        from atom_engine.pd.worker import PrefillWorker

        worker = await loop.run_in_executor(self.compute, PrefillWorker, self.settings)
        await loop.run_in_executor(self.compute, worker.warm)
        self.worker = worker
        # The service's jobs are _compute(job, gone): a prompt of len(job.tokens) - job.start to compute.
        queue_seconds = self.metrics.histogram("vllm:request_queue_time_seconds", "Time a prompt waited for the"
                                               " prefill worker.", buckets.REQUEST_LATENCY)
        self.queue = PrefillQueue(self.compute, lambda args: len(args[0].tokens) - args[0].start,
                                  queue_seconds.observe)
        self.service = PrefillService(worker, self.queue, send_timeout=self.settings.pd_send_timeout_seconds)
        self.kv_server = TcpServer(self.service.serve)
        port = await self.kv_server.start(self.host, self.settings.pd_kv_port)
        log.info("event=kv_listening host=%s port=%d", self.host, port)

    async def close(self) -> None:
        if self.kv_server is not None:
            await self.kv_server.close(grace=self.settings.finish_seconds)

    def stats(self) -> list[object]:
        if self.worker is None or self.service is None or self.queue is None:
            return super().stats()
        service = self.service.stats()
        # In flight: the HTTP routes' requests and the KV transport's (which no HTTP middleware sees).
        busy = InFlightStats(requests_in_flight=self.in_flight.count + service.prefill_in_flight)
        return [busy, self.worker.stats(), service, self.queue.stats()]


def make_server(settings: EngineSettings, role: Role, cpu: Allowance | None = None) -> EngineServer:
    return PrefillServer(settings, role, cpu) if role == "prefill" else OpenAIServer(settings, role, cpu)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Unknown routes and methods get OpenAI-style JSON errors too; unexpected exceptions a 500."""
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
    settings: EngineSettings, role: Role, host: str, port: int, cpu: Allowance | None = None
) -> tuple[EngineServer, web.AppRunner, int]:
    """Listen on host:port (0: a free port); the model loads in the background (see ``server.ready``)."""
    server = make_server(settings, role, cpu)
    server.host = host
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


async def serve(settings: EngineSettings, role: Role, host: str, port: int, metrics_port: int | None = None,
                cpu: Allowance | None = None) -> None:
    """Run until SIGTERM or SIGINT, then shut down without failing requests.

    1. Drain for ``drainSeconds``: /ready answers 503 and every request is still served. A pod being deleted is
       dropped from its Service's endpoints (and prefill workers from the headless name) only after the API
       server, the endpoint controller, kube-proxy and DNS have caught up; closing the listener at once would
       refuse the connections still routed here meanwhile. A second signal ends the drain early.
    2. Close the listeners and let in-flight requests finish, for up to ``finishSeconds``; then stop the engine.
    The pod's terminationGracePeriodSeconds covers both (see the operator's workload).
    """
    server, runner, _port = await start_server(settings, role, host, port, cpu)
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
