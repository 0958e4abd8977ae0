"""The decode side's client of the prefill workers: find them, spread work over them, fetch one frame (over a
:class:`~atom_engine.pd.transport.KVTransport`, plain TCP by default).

``prefillWorkers`` is ``host:port`` (a headless Service name resolving to every ready worker), or several of
them separated by commas. Names are re-resolved every ``resolve_interval`` seconds and after a failure, so
workers that come and go are followed. Each fetch goes to the worker with the fewest fetches in flight (ties
rotate); a worker that failed is avoided for ``cooldown`` seconds.

Fault policy: a worker that answers and fails (a 500, a timeout after connecting, a truncated or corrupt
frame) is not asked again for that request; the request moves on to another worker and fails with
:class:`PrefillUnavailable` (HTTP 503) after ``attempts`` such failures or when every known worker failed it.
A worker that does not answer at all (no address resolves; the connection is refused, times out or is closed
before any response; or it answers 503) is the normal state of a rollout or a restart, where endpoints lag the
pods by seconds. Then the request tries the other known workers and, when none answers, re-resolves and
retries with a short backoff until ``unavailable_wait`` seconds have passed, then fails with a 503. Retrying
is safe because a prefill has no side effect on the decode side (nothing is imported before the whole frame
has been checked); the bounds keep a sick or absent pool a clear 503 rather than an endless wait. The pool's
:class:`~atom_engine.pd.breaker.CircuitBreaker` makes that wait one window from the pool's first failure for
every request, not one per request (and fails fetches at once while open, until a probe finds a worker that
answers). Once the pool has failed, the whole fetch, the attempt under way included, ends by that window's end;
until then an attempt has the transport's timeouts (a healthy prefill may take up to the response timeout, the
worker's queue included), so a worker that accepts connections and never answers is found by the response
timeout, and every request then ends within one window of it.

A worker that refuses the request itself (a 4xx on the KV transport: the prompt is too long for it, its token
ids are out of its range) says nothing about the pool: the refusal is not retried on another worker (any would
refuse it), does not count against the breaker, and reaches the client as :class:`PrefillRefused`, that 4xx.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from atom_engine.errors import KVRefused, KVUnavailable
from atom_engine.pd.breaker import CircuitBreaker
from atom_engine.pd.tcp import TcpTransport
from atom_engine.pd.transport import KVTransport, PrefillRequest, Timeouts, WorkerFailed, WorkerRefused
from atom_engine.pd.wire import Expect, Shipment
from atom_engine.stats import ClientStats

log = logging.getLogger("atom_engine.pd")

Resolver = Callable[[str, int], Awaitable[list[str]]]


class PrefillUnavailable(KVUnavailable):
    """No prefill worker produced the KV (HTTP 503 for the request)."""


class PrefillRefused(KVRefused):
    """A prefill worker refused the request itself (its 4xx, passed on to the client)."""


def _attempt_text(address: str, error: str) -> str:
    """A failed attempt as the 503 and the breaker tell it: the worker, then what it did (an error that opens
    with its worker's address already says both)."""
    return error if error.startswith(f"{address} ") else f"{address}: {error}"


async def resolve_host(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({f"[{i[4][0]}]:{port}" if i[0] == socket.AF_INET6 else f"{i[4][0]}:{port}" for i in infos})


def parse_targets(spec: str) -> list[tuple[str, int]]:
    out = []
    for item in (s.strip() for s in spec.split(",")):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"prefillWorkers entries must be host:port; got {item!r}")
        out.append((host.strip("[]"), int(port)))
    return out


class PrefillClient:
    def __init__(self, targets: str, *, timeouts: Timeouts | None = None, transport: KVTransport | None = None,
                 attempts: int = 2, resolve_interval: float = 5.0, cooldown: float = 5.0,
                 resolver: Resolver = resolve_host,
                 unavailable_wait: float = 30.0, backoff: float = 0.05, max_backoff: float = 1.0,
                 probe_interval: float = 0.25) -> None:
        self.targets = parse_targets(targets)
        self.timeouts = timeouts or Timeouts()
        self.transport = transport or TcpTransport(self.timeouts)
        self.attempts = attempts
        self.unavailable_wait = unavailable_wait
        self.backoff, self.max_backoff = backoff, max_backoff
        self.resolve_interval = resolve_interval
        self.cooldown = cooldown
        self.resolver = resolver
        self.stats = ClientStats()
        self.breaker = CircuitBreaker(unavailable_wait, self.probe, probe_interval=probe_interval)
        self._addresses: list[str] = []
        self._resolved_at = -1e9
        self._in_flight: dict[str, int] = {}
        self._failed_at: dict[str, float] = {}
        self._turn = itertools.count()

    def figures(self) -> ClientStats:
        """The fetch counters (``stats``), the transport's bytes and time, and the breaker."""
        moved = self.transport.stats
        return replace(self.stats, pd_bytes_received=moved.bytes_received, pd_transfer_seconds=moved.transfer_seconds,
                       pd_breaker_state=int(self.breaker.state), pd_breaker_transitions=self.breaker.transitions)

    async def start(self) -> None:
        pass  # connections are the transport's, made per fetch

    async def close(self) -> None:
        await self.breaker.close()
        await self.transport.close()

    # -- discovery and spreading --------------------------------------------------------------------
    async def addresses(self, *, force: bool = False) -> list[str]:
        now = time.monotonic()
        if force or now - self._resolved_at >= self.resolve_interval or not self._addresses:
            found: list[str] = []
            for host, port in self.targets:
                try:
                    found += await asyncio.wait_for(self.resolver(host, port), self.timeouts.connect)
                except (OSError, TimeoutError) as exc:
                    log.warning("event=prefill_resolve_failed host=%s error=%r", host, exc)
            if found != self._addresses:
                log.info("event=prefill_workers addresses=%s", ",".join(found) or "-")
            self._addresses, self._resolved_at = list(dict.fromkeys(found)), now
        return self._addresses

    def pick(self, addresses: list[str], exclude: set[str]) -> str | None:
        """Fewest fetches in flight; healthy workers before ones that failed recently; ties rotate."""
        choices = [a for a in addresses if a not in exclude]
        if not choices:
            return None
        now = time.monotonic()
        turn = next(self._turn)
        order = {a: (i - turn) % len(choices) for i, a in enumerate(choices)}
        return min(choices, key=lambda a: (now - self._failed_at.get(a, -1e9) < self.cooldown,
                                           self._in_flight.get(a, 0), order[a]))

    # -- fetching -----------------------------------------------------------------------------------
    async def fetch(self, expect: Expect, prompt: list[int], buffer: bytearray | memoryview | None = None
                    ) -> Shipment:
        """The KV of ``prompt[expect.start:]`` from some worker, checked against ``expect``."""
        breaker = self.breaker
        if breaker.rejecting:
            raise PrefillUnavailable(breaker.unavailable_text())
        failed: set[str] = set()  # answered and failed: not asked again for this request
        unanswered: set[str] = set()  # did not answer in this round; asked again after the backoff
        errors: dict[str, str] = {}  # worker -> its last error, for the 503's message
        start = breaker.clock()
        delay = self.backoff
        attempt = 0
        asking: str | None = None  # the worker of the attempt under way
        first_failure: float | None = None  # when this fetch's first attempt failed (breaker clock)
        try:
            # Once any fetch has failed, the whole fetch (resolving, attempts under way, backoff) ends by the
            # failing window's end: a pool that fails or hangs is a 503 one window after its first failure for
            # every request, not one window per lane in waves.
            async with breaker.bounded():
                while len(failed) < self.attempts:
                    if breaker.rejecting:  # another fetch found the pool gone meanwhile
                        raise PrefillUnavailable(breaker.unavailable_text())
                    addresses = await self.addresses(force=attempt > 0)
                    address = self.pick(addresses, failed | unanswered)
                    if address is None:
                        if addresses and set(addresses) <= failed:
                            break  # every known worker answered this request with a failure
                        # None is known or none answered: a rollout or a restart; wait for one, within the bound.
                        deadline = breaker.deadline(start)
                        left = deadline - breaker.clock()
                        if left <= 0:
                            breaker.gave_up(deadline, first_failure)
                            break
                        await asyncio.sleep(min(delay, left))
                        delay = min(delay * 2, self.max_backoff)
                        unanswered.clear()
                        continue
                    if attempt:
                        self.stats.pd_retries += 1
                    attempt += 1
                    asking = address
                    try:
                        ship = await self._fetch_from(address, expect, prompt, buffer)
                    except WorkerRefused as exc:
                        # The request itself is bad (the worker's 4xx): any worker would refuse it, and the pool
                        # is as healthy as before, so no retry, no failure counted, and the client gets the 4xx.
                        log.info("event=prefill_refused request_id=%s worker=%s status=%d error=%s",
                                 expect.request_id, address, exc.status, exc)
                        raise PrefillRefused(str(exc), status=exc.status, code=exc.code) from exc
                    except WorkerFailed as exc:
                        asking = None
                        self._failed(address, str(exc), exc.unanswered, attempt, expect, failed, unanswered, errors)
                        first_failure = breaker.last_failure if first_failure is None else first_failure
                        continue
                    breaker.success()
                    return ship
        except TimeoutError:
            # First the window (when this was its end, the pool failed for a whole window: open), then the
            # attempt's own failure (when it was the pool's first, a window opens from it).
            breaker.gave_up(breaker.deadline(start), first_failure)
            if asking is not None:  # the attempt under way ran into the deadline: that worker failed it
                self.stats.pd_failures += 1
                why = (f"no shipment within pdUnavailableWaitSeconds ({self.unavailable_wait:g}s) of the pool's first"
                       " failure")
                self._failed(asking, why, False, attempt, expect, failed, unanswered, errors)
        if not errors and breaker.rejecting:  # began as the window ran out: the pool's story, not this fetch's
            raise PrefillUnavailable(breaker.unavailable_text())
        if not errors:
            raise PrefillUnavailable(f"no prefill worker found for {self._target_text()}"
                                     f" (waited {breaker.clock() - start:.1f}s)")
        raise PrefillUnavailable(f"prefill failed on {len(errors)} worker(s): "
                                 + "; ".join(_attempt_text(a, e) for a, e in errors.items()))

    def _failed(self, address: str, error: str, unanswered_: bool, attempt: int, expect: Expect,
                failed: set[str], unanswered: set[str], errors: dict[str, str]) -> None:
        """One attempt failed: the worker is avoided for a while, and the pool's breaker hears of it."""
        self._failed_at[address] = time.monotonic()
        errors[address] = error
        (unanswered if unanswered_ else failed).add(address)
        self.breaker.failure(_attempt_text(address, error))
        log.warning("event=prefill_attempt_failed request_id=%s worker=%s attempt=%d answered=%s error=%s",
                    expect.request_id, address, attempt, not unanswered_, error)

    async def probe(self) -> bool:
        """Whether some worker of the pool answers (the breaker's half-open probe)."""
        for address in await self.addresses(force=True):
            if await self.transport.ping(address):
                return True
        return False

    def _target_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.targets)

    def _fail(self, message: str, *, unanswered: bool = False) -> WorkerFailed:
        self.stats.pd_failures += 1
        return WorkerFailed(message, unanswered=unanswered)

    async def _fetch_from(self, address: str, expect: Expect, prompt: list[int],
                          buffer: bytearray | memoryview | None) -> Shipment:
        self.stats.pd_attempts += 1
        self._in_flight[address] = self._in_flight.get(address, 0) + 1
        request = PrefillRequest(expect.request_id, prompt, expect.start, expect.prompt_logprobs)
        try:
            return await self.transport.fetch(address, request, expect, buffer)
        except WorkerFailed as exc:
            raise self._fail(str(exc), unanswered=exc.unanswered) from exc
        finally:
            self._in_flight[address] -= 1
