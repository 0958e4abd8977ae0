"""A circuit breaker for one prefill pool (the workers behind one ``prefillWorkers`` spec).

Without it each fetch waits out its own window, so with the pool gone requests fail in waves: those holding the
lanes wait ``unavailable_wait``, then the queued ones get the lanes and wait again. The breaker remembers:

- **closed**: fetches run; a fetch that finds no worker to answer retries until its own deadline (``wait``
  seconds from its start). An attempt under way is bounded only by the transport's timeouts while the pool has
  not failed: a healthy prefill may take up to the response timeout (the worker's queue included). The first
  failed attempt after a success opens a *failing window* of ``wait`` seconds; while it is open every fetch ends
  by its end, attempts under way included (:meth:`CircuitBreaker.bounded`; a fetch started later does not get a
  window of its own), so a pool that fails, or hangs until one response timeout says so, costs every request at
  most one window from that first failure. A success closes the window and lifts that bound.
- **open**: the window ended with no success (a fetch gave up at its end, or a failure came after it), or the
  fetch whose failure opened the window met nothing but failures until its own deadline: every fetch fails at
  once with :class:`PrefillUnavailable`. A probe runs every ``probe_interval`` seconds.
- **half-open**: a probe is asking the workers; fetches still fail at once. The first worker that answers
  closes the breaker, so service is back within one probe interval of a worker's return.

A failure older than ``wait`` with nothing since does not count: a lone failure a minute ago says nothing about
the pool now. Pure logic and an asyncio task; the clock is injectable for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

log = logging.getLogger("atom_engine.pd")


class State(enum.IntEnum):
    """The gauge's values."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    def __init__(self, wait: float, probe: Callable[[], Awaitable[bool]], *, probe_interval: float = 0.25,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``probe``: True when some worker of the pool answers (it must end within its own timeouts)."""
        self.wait = wait
        self.probe = probe
        self.probe_interval = probe_interval
        self.clock = clock
        self.state = State.CLOSED
        self.transitions = 0
        self.failing_since: float | None = None
        self.last_failure: float | None = None
        self.last_error = ""
        self._prober: asyncio.Task | None = None
        self._bounds: set[asyncio.Timeout] = set()  # the fetches under way

    @property
    def rejecting(self) -> bool:
        """Open or half-open: fetches fail at once."""
        return self.state is not State.CLOSED

    def deadline(self, start: float) -> float:
        """A fetch started at ``start`` ends by this time: its own window, or the failing window's end."""
        own = start + self.wait
        return own if self.failing_since is None else min(own, self.failing_since + self.wait)

    @contextlib.asynccontextmanager
    async def bounded(self) -> AsyncIterator[asyncio.Timeout]:
        """Run a fetch, attempts under way included, until the failing window's end (then TimeoutError): unbounded
        while the pool has not failed, and following the window as failures open it and a success lifts it."""
        async with asyncio.timeout(None) as bound:
            self._bounds.add(bound)
            self._reschedule(bound)
            try:
                yield bound
            finally:
                self._bounds.discard(bound)

    def _reschedule(self, bound: asyncio.Timeout) -> None:
        if bound.expired():  # one that fired is unwinding its fetch already
            return
        if self.failing_since is None:
            bound.reschedule(None)
        else:
            bound.reschedule(asyncio.get_running_loop().time() + self.failing_since + self.wait - self.clock())

    def _window_moved(self) -> None:
        for bound in list(self._bounds):
            self._reschedule(bound)

    def success(self) -> None:
        opened = self.failing_since is not None
        self.failing_since = self.last_failure = None
        self._move(State.CLOSED)
        if opened:  # the pool serves again: fetches under way are no longer cut at the window's end
            self._window_moved()

    def failure(self, error: str) -> None:
        now = self.clock()
        if self.state is not State.CLOSED:  # open already: the probes decide when it closes, not the windows
            self.last_error = error
            return
        if self.last_failure is None or now - self.last_failure > self.wait:
            self.failing_since = now  # a new failing window (an old lone failure does not count)
            self._window_moved()  # every fetch under way ends by its end now
        self.last_failure, self.last_error = now, error
        assert self.failing_since is not None
        if now - self.failing_since >= self.wait:
            self.open()

    def gave_up(self, deadline: float, first_failure: float | None = None) -> None:
        """A fetch ran out of time at ``deadline`` without a success (``first_failure``: when its own first failed
        attempt was). The window passed when that was the window's end; or when that fetch's failure opened the
        window, since it then met only failures from the window's start to its own deadline, which comes first
        only by the time its first attempt took (a lone request on a dead pool opens the breaker itself)."""
        since = self.failing_since
        if since is not None and (deadline >= since + self.wait or first_failure == since):
            self.open()

    def open(self) -> None:
        if self.state is State.CLOSED:
            self._move(State.OPEN)
            log.warning("event=prefill_breaker_open since=%.3fs error=%s",
                        self.clock() - (self.failing_since or self.clock()), self.last_error)
            if self._prober is None or self._prober.done():
                self._prober = asyncio.get_running_loop().create_task(self._probe_until_closed())

    def unavailable_text(self) -> str:
        since = self.clock() - (self.failing_since if self.failing_since is not None else self.clock())
        return (f"the prefill pool has failed for {since:.1f}s (circuit open, pdUnavailableWaitSeconds"
                f" {self.wait:g}); last error: {self.last_error}")

    async def _probe_until_closed(self) -> None:
        while self.state is not State.CLOSED:
            await asyncio.sleep(self.probe_interval)
            self._move(State.HALF_OPEN)
            try:
                answered = await self.probe()
            except Exception as exc:  # noqa: BLE001 - a probe that fails is a pool still down
                answered, self.last_error = False, f"probe: {exc!r}"
            if answered:
                log.info("event=prefill_breaker_closed")
                self.success()
            else:
                self._move(State.OPEN)

    def _move(self, state: State) -> None:
        if state is not self.state:
            self.state = state
            self.transitions += 1

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
