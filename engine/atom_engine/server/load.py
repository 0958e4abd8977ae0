"""A pod's load as an autoscaler reads it: what waits, what runs, how busy the pod was, and whether it is idle.

- :class:`InFlight`: requests on the role's routes that have not finished (streams included; probes and /metrics
  excluded). A cordoned pod is idle, and safe to delete, when this is 0.
- :class:`PrefillQueue`: the prefill worker's compute executor (one thread, one prompt at a time), measured:
  prompts queued and running, their tokens, the thread's busy seconds and each prompt's time in the queue.
- :class:`TimedFetches`: the decode side's prefill client with each fetch timed as decode sees it (the worker's
  queue, its compute and the transfer).

Each is a wrapper around what the server already has, so the request path itself carries no branch for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from aiohttp import web

from atom_engine.stats import InFlightStats, QueueStats

# Paths that are not work: probes and scrapes never keep a pod busy.
NOT_WORK = frozenset({"/health", "/ready", "/metrics"})


class InFlight:
    """An aiohttp middleware counting requests in flight on the role's routes."""

    def __init__(self) -> None:
        self.count = 0  # only touched on the event loop

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in NOT_WORK:
            return await handler(request)
        self.count += 1
        try:
            return await handler(request)
        finally:
            self.count -= 1

    def stats(self) -> InFlightStats:
        return InFlightStats(requests_in_flight=self.count)


class PrefillQueue(Executor):
    """``inner`` (the compute thread) with its queue measured; ``size(args)`` is a job's prompt tokens."""

    def __init__(self, inner: Executor, size: Callable[[tuple], int],
                 observe_queue: Callable[[float], None] = lambda _s: None) -> None:
        self.inner, self.size, self.observe_queue = inner, size, observe_queue
        self._lock = threading.Lock()
        self.waiting = self.running = self.waiting_tokens = 0
        self.busy_seconds = 0.0
        self._busy_since: float | None = None

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        tokens = self.size(args)
        queued = time.perf_counter()
        with self._lock:
            self.waiting += 1
            self.waiting_tokens += tokens
        started = threading.Event()

        def run() -> Any:
            self._start(tokens, queued, started)
            try:
                return fn(*args, **kwargs)
            finally:
                self._finish()

        future = self.inner.submit(run)
        # Cancelled before it ran (the decoder left first): it leaves the queue without ever running.
        future.add_done_callback(lambda f: None if started.is_set() else self._dequeue(tokens))
        return future

    def _start(self, tokens: int, queued: float, started: threading.Event) -> None:
        now = time.perf_counter()
        with self._lock:
            started.set()
            self.waiting -= 1
            self.waiting_tokens -= tokens
            self.running += 1
            self._busy_since = now
        self.observe_queue(now - queued)

    def _finish(self) -> None:
        with self._lock:
            self.running -= 1
            if self._busy_since is not None:
                self.busy_seconds += time.perf_counter() - self._busy_since
                self._busy_since = None

    def _dequeue(self, tokens: int) -> None:
        with self._lock:
            self.waiting -= 1
            self.waiting_tokens -= tokens

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.inner.shutdown(wait=wait, cancel_futures=cancel_futures)

    def stats(self) -> QueueStats:
        with self._lock:
            busy = self.busy_seconds
            if self._busy_since is not None:  # the prompt computing now counts up to this scrape
                busy += time.perf_counter() - self._busy_since
            return QueueStats(running=self.running, waiting=self.waiting, prefill_tokens_waiting=self.waiting_tokens,
                              prefill_busy_seconds=busy)


class TimedFetches:
    """The prefill client, each ``fetch`` timed into ``observe`` (failed fetches too); all else passes through."""

    def __init__(self, client: Any, observe: Callable[[float], None]) -> None:
        self._client, self._observe = client, observe

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await self._client.fetch(*args, **kwargs)
        finally:
            self._observe(time.perf_counter() - began)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
