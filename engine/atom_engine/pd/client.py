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
answers).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from atom_engine.errors import KVUnavailable
from atom_engine.pd.breaker import CircuitBreaker
from atom_engine.pd.tcp import TcpTransport
from atom_engine.pd.transport import KVTransport, PrefillRequest, Timeouts, WorkerFailed
from atom_engine.pd.wire import Expect, Shipment

log = logging.getLogger("atom_engine.pd")

Resolver = Callable[[str, int], Awaitable[list[str]]]


class PrefillUnavailable(KVUnavailable):
    """No prefill worker produced the KV (HTTP 503 for the request)."""


@dataclass
class ClientStats:
    """The client's figures for /metrics (the table in :mod:`atom_engine.server.metrics` names these fields)."""

    pd_attempts: int = 0
    pd_retries: int = 0
    pd_failures: int = 0


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

    def figures(self) -> dict[str, float]:
        moved = self.transport.stats
        return {**asdict(self.stats), "pd_bytes_received": moved.bytes_received,
                "pd_transfer_seconds": moved.transfer_seconds, "pd_breaker_state": int(self.breaker.state),
                "pd_breaker_transitions": self.breaker.transitions}

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
    async def fetch(self, expect: Expect, prompt: list[int], buffer: bytearray | None = None) -> Shipment:
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
        while len(failed) < self.attempts:
            if breaker.rejecting:  # another fetch found the pool gone meanwhile
                raise PrefillUnavailable(breaker.unavailable_text())
            deadline = breaker.deadline(start)  # shortened once a failing window opens
            addresses = await self.addresses(force=attempt > 0)
            address = self.pick(addresses, failed | unanswered)
            if address is None:
                if addresses and set(addresses) <= failed:
                    break  # every known worker answered this request with a failure
                # None is known or none answered: a rollout or a restart; wait for one, within the bound.
                left = deadline - breaker.clock()
                if left <= 0:
                    breaker.gave_up(deadline)
                    break
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, self.max_backoff)
                unanswered.clear()
                continue
            if attempt:
                self.stats.pd_retries += 1
            attempt += 1
            try:
                # While the pool is failing, an attempt may not outlast the failing window (a hung pool).
                bound = None if breaker.failing_since is None else max(0.0, deadline - breaker.clock())
                try:
                    async with asyncio.timeout(bound):
                        ship = await self._fetch_from(address, expect, prompt, buffer)
                except TimeoutError as exc:
                    raise self._fail("no shipment by the end of the pool's failing window"
                                     f" ({self.unavailable_wait:g}s)") from exc
            except WorkerFailed as exc:
                self._failed_at[address] = time.monotonic()
                errors[address] = str(exc)
                (unanswered if exc.unanswered else failed).add(address)
                breaker.failure(f"{address}: {exc}")
                log.warning("event=prefill_attempt_failed request_id=%s worker=%s attempt=%d answered=%s error=%s",
                            expect.request_id, address, attempt, not exc.unanswered, exc)
                continue
            breaker.success()
            return ship
        if not errors:
            raise PrefillUnavailable(f"no prefill worker found for {self._target_text()}"
                                     f" (waited {breaker.clock() - start:.1f}s)")
        raise PrefillUnavailable(f"prefill failed on {len(errors)} worker(s): "
                                 + "; ".join(f"{a}: {e}" for a, e in errors.items()))

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
                          buffer: bytearray | None) -> Shipment:
        self.stats.pd_attempts += 1
        self._in_flight[address] = self._in_flight.get(address, 0) + 1
        request = PrefillRequest(expect.request_id, prompt, expect.start, expect.prompt_logprobs)
        try:
            return await self.transport.fetch(address, request, expect, buffer)
        except WorkerFailed as exc:
            raise self._fail(str(exc), unanswered=exc.unanswered) from exc
        finally:
            self._in_flight[address] -= 1
