"""The prefill pool's circuit breaker on a fake clock: one failing window from the first failure for every
fetch, open after it, half-open probes, closed by the first worker that answers; an old lone failure does not
count."""

from __future__ import annotations

import asyncio

import pytest
from atom_engine.pd.breaker import CircuitBreaker, State

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
