"""The controller's work queue: each key pending once, never two workers on one key, urgent keys first."""

from __future__ import annotations

import asyncio

import pytest
from atom_operator.workqueue import ROUTINE, URGENT, WorkQueue

A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")


async def drain(queue: WorkQueue) -> list:
    """Every key the queue hands out now, each marked done at once."""
    taken = []
    while True:
        try:
            key = await asyncio.wait_for(queue.get(), 0.05)
        except TimeoutError:
            return taken
        taken.append(key)
        queue.done(key)


async def test_a_key_named_by_many_events_is_reconciled_once() -> None:
    queue = WorkQueue()
    for _ in range(3):
        queue.add(A, ROUTINE)
        queue.add(B, ROUTINE)
    assert len(queue) == 2
    assert await drain(queue) == [A, B]


async def test_what_a_user_asked_for_goes_before_status_news_and_each_priority_keeps_its_order() -> None:
    queue = WorkQueue()
    queue.add(A, ROUTINE)
    queue.add(B, ROUTINE)
    queue.add(C, URGENT)
    assert await drain(queue) == [C, A, B]


async def test_a_waiting_key_raised_to_urgent_goes_first_and_only_once() -> None:
    queue = WorkQueue()
    queue.add(A, ROUTINE)
    queue.add(B, ROUTINE)
    queue.add(B, URGENT)
    queue.add(B, ROUTINE)  # lowering does nothing
    assert await drain(queue) == [B, A]


async def test_a_key_being_reconciled_is_not_handed_out_again_until_it_is_done() -> None:
    queue = WorkQueue()
    queue.add(A, ROUTINE)
    running = await queue.get()
    queue.add(A, URGENT)  # news while it runs
    queue.add(B, ROUTINE)
    assert await drain(queue) == [B]  # not A: a second worker would reconcile it at the same time
    queue.done(running)
    assert await drain(queue) == [A]
    assert len(queue) == 0


@pytest.mark.parametrize("first", [ROUTINE, URGENT])
async def test_a_raised_key_that_was_taken_leaves_no_stale_entry_behind(first: int) -> None:
    queue = WorkQueue()
    queue.add(A, first)
    queue.add(A, URGENT)
    assert await drain(queue) == [A]
    queue.add(A, ROUTINE)
    assert await drain(queue) == [A]
