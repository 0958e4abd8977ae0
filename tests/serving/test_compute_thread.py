"""A server runs all of its model work in one compute thread (atom_engine.server.compute says why: a second
thread's OpenMP team made every decode step pay a wake-up per parallel region)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from atom_engine.batcher import Batcher
from atom_engine.engine import LLMEngine
from atom_engine.pd import wire
from atom_engine.pd.worker import PrefillWorker
from atom_engine.server.compute import ComputeThread

from tests.serving.conftest import MODEL, client, in_process
from tests.serving.test_pd import answer_kind


def record_threads(monkeypatch: pytest.MonkeyPatch, owner: Any, names: list[str]) -> dict[str, set[int]]:
    """Wrap ``owner``'s methods (or module functions) to note each thread that calls them."""
    seen: dict[str, set[int]] = {n: set() for n in names}
    for name in names:
        original: Callable[..., Any] = getattr(owner, name)

        def wrapper(*args: Any, _name: str = name, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            seen[_name].add(threading.get_ident())
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)
    return seen


@pytest.mark.asyncio(loop_scope="session")
async def test_standalone_loads_warms_and_steps_in_its_compute_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_threads(monkeypatch, LLMEngine, ["__init__", "warm"])
    seen |= record_threads(monkeypatch, Batcher, ["step"])
    async with in_process("standalone", lanes=2, kv_blocks=4) as (server, url):
        out = await client(url).completions.create(model=MODEL, prompt="one thread", max_tokens=4)
        assert out.choices[0].finish_reason == "length"
        compute = server.compute.thread.ident
        assert compute != threading.get_ident()
        assert seen == {"__init__": {compute}, "warm": {compute}, "step": {compute}}
        assert server.aengine is not None and server.aengine.alive
    assert _joins(server.compute.thread)  # closing the server ends its compute thread


@pytest.mark.asyncio(loop_scope="session")
async def test_prefill_worker_loads_computes_and_encodes_in_its_compute_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_threads(monkeypatch, PrefillWorker, ["__init__", "warm", "compute"])
    seen |= record_threads(monkeypatch, wire, ["encode"])
    async with in_process("prefill", pd_kv_port=0) as (server, _url):
        assert server.kv_server is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.kv_server.port)
        request = {"request_id": "r1", "prompt_token_ids": [5, 6, 7, 8], "start": 0, "lease_seconds": 10.0}
        writer.write(wire.message(wire.REQUEST, request))
        await writer.drain()
        assert await answer_kind(reader, 60) == wire.FRAME  # the KV frame
        writer.close()
        compute = server.compute.thread.ident
        assert seen == {"__init__": {compute}, "warm": {compute}, "compute": {compute}, "encode": {compute}}


def _joins(thread: threading.Thread) -> bool:
    thread.join(5)
    return not thread.is_alive()


def test_compute_thread_runs_jobs_in_order_on_one_daemon_thread() -> None:
    compute = ComputeThread("test-compute")
    assert compute.thread.daemon
    order: list[int] = []
    futures = [compute.submit(lambda i=i: (order.append(i), threading.get_ident())[1]) for i in range(20)]
    assert {f.result(5) for f in futures} == {compute.thread.ident}
    assert order == list(range(20))
    compute.shutdown()
    assert not compute.thread.is_alive()
    with pytest.raises(RuntimeError, match="shut down"):
        compute.submit(print)


def test_compute_thread_hands_errors_to_the_caller_and_goes_on() -> None:
    compute = ComputeThread()

    def boom() -> None:
        raise ValueError("bad job")

    with pytest.raises(ValueError, match="bad job"):
        compute.submit(boom).result(5)
    assert compute.submit(lambda: 42).result(5) == 42  # the thread survived the failing job
    compute.shutdown()


def test_compute_thread_shutdown_cancels_queued_jobs_not_the_running_one() -> None:
    compute = ComputeThread()
    started, release = threading.Event(), threading.Event()
    running = compute.submit(lambda: started.set() or (release.wait(5) and "finished"))
    queued = compute.submit(lambda: "never")
    assert started.wait(5)  # the first job holds the thread; the second is still queued
    compute.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    release.set()
    assert running.result(5) == "finished"
    compute.thread.join(5)
    assert not compute.thread.is_alive()
