"""The prefill pool's circuit breaker on a fake clock: one failing window from the first failure for every
fetch, open after it, half-open probes, closed by the first worker that answers; an old lone failure does not
count. Then the pool client on real loopback sockets: a worker that accepts and never answers costs a fetch its
deadline, not the transport's timeouts; a worker's refusal of the request itself is passed on, not retried and
not held against the pool."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import torch
from atom_engine.pd.breaker import CircuitBreaker, State
from atom_engine.pd.client import PrefillClient, PrefillRefused, PrefillUnavailable
from atom_engine.pd.tcp import TcpConnection, TcpServer
from atom_engine.pd.transport import Timeouts
from atom_engine.pd.wire import Expect

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_every_fetch_ends_within_one_window_of_the_first_failure() -> None:
    clock, answers = Clock(), [False, False, True]
    b = CircuitBreaker(10.0, lambda: asyncio.sleep(0, answers.pop(0)), probe_interval=0.001, clock=clock)
    assert b.deadline(100.0) == 110.0 and not b.rejecting
    b.failure("refused")
    clock.now = 104.0
    assert b.deadline(104.0) == 110.0  # a fetch that starts later does not get a window of its own
    b.failure("refused")
    assert b.state is State.CLOSED
    b.gave_up(108.0)  # a fetch that ended before the window's end says nothing about the whole window
    assert b.state is State.CLOSED
    clock.now = 110.0
    b.gave_up(110.0)
    assert b.state is State.OPEN and b.rejecting and "circuit open" in b.unavailable_text()
    for _ in range(100):
        if b.state is State.CLOSED:
            break
        await asyncio.sleep(0.002)
    assert b.state is State.CLOSED and answers == []  # two probes failed, the third found a worker
    assert b.transitions == 7  # open, (half-open, open) twice, half-open, closed
    assert b.deadline(110.0) == 120.0 and b.failing_since is None
    await b.close()


async def test_a_success_closes_the_window_and_a_lone_old_failure_does_not_count() -> None:
    clock = Clock()
    b = CircuitBreaker(10.0, lambda: asyncio.sleep(0, True), clock=clock)
    b.failure("one")
    b.success()
    assert b.failing_since is None
    b.failure("two")
    clock.now = 150.0  # nothing for longer than a window
    b.failure("three")
    assert b.state is State.CLOSED and b.failing_since == 150.0
    clock.now = 160.0
    b.failure("four")  # failures without a success for a whole window: open
    assert b.state is State.OPEN
    await b.close()


async def test_a_fetch_whose_failure_opened_the_window_opens_the_breaker_when_it_gives_up_at_its_deadline(
        ) -> None:
    clock = Clock()
    b = CircuitBreaker(10.0, lambda: asyncio.sleep(0, True), probe_interval=60.0, clock=clock)
    clock.now = 100.01
    b.failure("refused")  # the first attempt of a fetch started at 100
    clock.now = 109.0
    b.gave_up(109.0)  # another fetch, started at 99, which did not see the pool fail for a window
    assert b.state is State.CLOSED
    clock.now = 110.0
    b.gave_up(b.deadline(100.0), first_failure=100.01)  # met only failures until its own deadline
    assert b.state is State.OPEN
    await b.close()


async def test_a_fetch_under_way_is_bounded_only_while_the_pool_is_failing() -> None:
    """A healthy prefill may take up to the transport's response timeout; a failure anywhere in the pool bounds
    every fetch under way by the failing window's end, and a success lifts the bound again."""
    clock = Clock()
    b = CircuitBreaker(10.0, lambda: asyncio.sleep(0, True), clock=clock)
    loop = asyncio.get_running_loop()
    async with b.bounded() as bound:
        assert bound.when() is None  # the pool has not failed: the transport's timeouts alone
        clock.now = 105.0
        b.failure("refused")
        assert bound.when() - loop.time() == pytest.approx(10.0, abs=0.05)  # the failing window's end
        clock.now = 109.0
        b.success()
        assert bound.when() is None
    await b.close()


def expect(request_id: str) -> Expect:
    return Expect(request_id, 0, [1, 2, 3], layers=1, kv_heads=1, head_dim=2, vocab=8, dtype=torch.float32)


async def test_a_worker_that_accepts_and_never_answers_fails_every_fetch_one_window_after_its_first_timeout(
        ) -> None:
    # A listener that never accepts: the kernel completes the connections, nobody answers (a hung worker).
    hung = socket.create_server(("127.0.0.1", 0), backlog=16)
    wait, timeouts = 1.0, Timeouts(response=1.0, total=60.0)
    client = PrefillClient(f"127.0.0.1:{hung.getsockname()[1]}", timeouts=timeouts, unavailable_wait=wait,
                           probe_interval=60.0)
    try:
        t0 = time.monotonic()
        first = await asyncio.gather(*(client.fetch(expect(f"r{i}"), [1, 2, 3]) for i in range(2)),
                                     return_exceptions=True)
        took = time.monotonic() - t0
        for exc in first:
            assert isinstance(exc, PrefillUnavailable), exc
        # The response timeout finds the hang; the retries on the same hung worker end with that window.
        assert timeouts.response * 0.9 <= took < timeouts.response + wait + 5.0
        assert client.breaker.state is State.CLOSED and client.breaker.failing_since is not None
        # A fetch begun in the failing window ends with it, and the window passed without a success: open.
        t1 = time.monotonic()
        with pytest.raises(PrefillUnavailable):
            await client.fetch(expect("r2"), [1, 2, 3])
        assert time.monotonic() - t1 < wait + 5.0 and client.breaker.state is not State.CLOSED
        t1 = time.monotonic()
        with pytest.raises(PrefillUnavailable, match="circuit open"):
            await client.fetch(expect("r3"), [1, 2, 3])
        assert time.monotonic() - t1 < wait
    finally:
        await client.close()
        hung.close()


async def test_a_workers_refusal_of_the_request_is_passed_on_not_retried_and_not_held_against_the_pool() -> None:
    asked: list[str] = []

    async def refuse(conn: TcpConnection) -> None:
        _kind, body = await conn.read_request(5.0)
        asked.append(body["request_id"])
        await conn.send_error(400, "the prompt has 3 tokens; maxSeqLen is 2", "invalid_request", 5.0)

    servers = [TcpServer(refuse) for _ in range(2)]
    ports = [await s.start("127.0.0.1", 0) for s in servers]
    client = PrefillClient(",".join(f"127.0.0.1:{p}" for p in ports), unavailable_wait=5.0)
    try:
        with pytest.raises(PrefillRefused) as info:
            await client.fetch(expect("bad"), [1, 2, 3])
        assert info.value.status == 400 and info.value.code == "invalid_request"
        assert "maxSeqLen is 2" in str(info.value)
        assert asked == ["bad"]  # one worker asked: any other would refuse it as well
        assert client.stats.pd_retries == client.stats.pd_failures == 0
        assert client.breaker.failing_since is None and client.breaker.state is State.CLOSED
    finally:
        await client.close()
        for s in servers:
            await s.close()
