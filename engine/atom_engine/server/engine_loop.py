"""The engine loop: ``LLMEngine.step()`` in the server's compute thread (:mod:`atom_engine.server.compute`, the
thread that loaded the model); outputs handed to the event loop per request.

The event loop never runs a model step. ``submit`` queues a request (thread-safe in the engine) and returns an
async stream of its :class:`StepOutput`s (:class:`RequestStream`); closing the stream early (client gone) cancels
the request, which frees its lane and block at the next step. If a step raises (a bug, not a request's fault:
those are isolated by the batcher) the loop stops, every open stream ends with an error and /health turns 503.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams, StepOutput

log = logging.getLogger("atom_engine.server")
IDLE_WAIT = 0.5  # a bound, not a poll interval: new work sets the wakeup event
STALL_WAIT = 0.05  # every lane waits for a shipment; its arrival sets the wakeup event


class EngineDead(RuntimeError):
    """The engine loop stopped; nothing more will be served."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop,
                 compute: concurrent.futures.Executor) -> None:
        """``compute``: the thread that loaded the engine (the loop then holds it until stopped)."""
        self.engine = engine
        self.loop = loop
        self.compute = compute
        self.wakeup = threading.Event()
        engine.set_wakeup(self.wakeup.set)  # the KV connector wakes the loop when a shipment arrives
        self.streams: dict[str, asyncio.Queue[StepOutput | BaseException]] = {}
        self.error: str | None = None
        self._stop = threading.Event()
        self._running: concurrent.futures.Future | None = None

    @property
    def alive(self) -> bool:
        return self._running is not None and not self._running.done() and self.error is None

    def start(self) -> None:
        self._running = self.compute.submit(self._run)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.wakeup.set()
        if self._running is not None:
            concurrent.futures.wait([self._running], timeout)

    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stop.is_set():
                if not engine.has_unfinished():
                    self.wakeup.wait(IDLE_WAIT)
                    self.wakeup.clear()
                    continue
                outs = engine.step()
                if outs:
                    self.loop.call_soon_threadsafe(self._deliver, outs)
                elif engine.stalled:
                    self.wakeup.wait(STALL_WAIT)  # waiting for shipments, slots or a producer to finish
                    self.wakeup.clear()
        except BaseException as exc:  # noqa: BLE001 - report any death of the loop, then end every stream
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("event=engine_loop_died error=%r", self.error)
            self.loop.call_soon_threadsafe(self._fail_all, EngineDead(f"the engine loop stopped: {self.error}"))

    def _deliver(self, outs: list[StepOutput]) -> None:
        for out in outs:
            queue = self.streams.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)

    def _fail_all(self, exc: BaseException) -> None:
        for queue in self.streams.values():
            queue.put_nowait(exc)

    async def submit(self, prompt: list[int], params: SamplingParams, request_id: str
                     ) -> RequestStream:
        """Queue a request (RequestRejected: 400, QueueFull: 429, EngineDead: 503) and stream its outputs."""
        if not self.alive:
            raise EngineDead(f"the engine loop stopped: {self.error}")
        queue: asyncio.Queue[StepOutput | BaseException] = asyncio.Queue()
        self.streams[request_id] = queue
        try:
            self.engine.add_request(prompt, params, request_id)
        except BaseException:
            del self.streams[request_id]
            raise
        self.wakeup.set()
        return RequestStream(self, request_id, queue)

    def abandon(self, request_id: str) -> None:
        """Cancel a request whose stream was never read (its request was refused part way through queueing)."""
        if self.streams.pop(request_id, None) is not None:
            self.engine.cancel(request_id)
            self.wakeup.set()


class RequestStream:
    """One request's outputs as an async iterator. Closing it before the last output cancels the request, and
    closing works whether or not anyone ever iterated it: a client that left before the handler's tasks first
    ran (an async generator that never started would never run its ``finally``) still frees its lane."""

    def __init__(self, aengine: AsyncEngine, request_id: str, queue: asyncio.Queue) -> None:
        self.aengine, self.request_id, self.queue = aengine, request_id, queue
        self.finished = False
        self.closed = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StepOutput:
        if self.finished or self.closed:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        if item.finished:
            self.finished = True
            self.close()
        return item

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Idempotent; synchronous, so it also runs from a cancelled task's cleanup."""
        if self.closed:
            return
        self.closed = True
        self.aengine.streams.pop(self.request_id, None)
        if not self.finished:
            self.aengine.engine.cancel(self.request_id)  # the client left: lane and block go at the next step
            self.aengine.wakeup.set()
            log.info("event=request_cancelled request_id=%s", self.request_id)
