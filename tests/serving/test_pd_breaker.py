"""The prefill pool's circuit breaker on real servers: with the pool down, more requests than lanes all get a
503 ``prefill_unavailable`` within one wait window of the first failure (not one window per wave of lanes), a
request that comes while the breaker is open fails at once, and a worker that comes back is found by the
half-open probe and serves token-exact at once. A hung pool (a stopped worker whose kernel still accepts
connections) is the same: every request ends by its deadline, never at the transport's response timeout; and it is
found by its silence a lease after a request, since a live worker acknowledges every heartbeat."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import openai
import pytest
from atom_localcluster.cluster import free_port

from tests.serving.conftest import (
    BASE,
    MODEL,
    assert_no_block_leaked,
    client,
    idle,
    in_process,
    reference_tokens,
    spawn,
    wait_metrics,
    wait_ready,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
WAIT = 3.0  # pdUnavailableWaitSeconds
LANES = 2
REQUESTS = 3 * LANES  # three waves of lanes: without the breaker the last would end after 3 * WAIT
RESPONSE = 8.0  # pdResponseTimeoutSeconds in the hung-pool test: how long a hang goes unnoticed


async def answered_at(url: str, prompt: str, t0: float) -> tuple[float, openai.APIStatusError | None]:
    try:
        await client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    except openai.APIStatusError as exc:
        return time.monotonic() - t0, exc
    return time.monotonic() - t0, None


async def test_pool_down_fails_every_request_in_one_window_and_a_returning_worker_closes_it(
        tmp_path: Path) -> None:
    port = free_port()  # nothing listens here yet: the pool is down
    settings = dict(lanes=LANES, kv_blocks=LANES + 1, prefix_cache=False, local_prefill=False,
                    prefill_workers=f"127.0.0.1:{port}", pd_unavailable_wait_seconds=WAIT)
    async with in_process("decode", **settings) as (_s, url):
        t0 = time.monotonic()
        results = await asyncio.gather(*(answered_at(url, f"queued request {i}", t0) for i in range(REQUESTS)))
        for _took, exc in results:
            assert exc is not None and exc.status_code == 503 and exc.body["code"] == "prefill_unavailable", exc
        slowest = max(took for took, _ in results)
        assert WAIT * 0.9 <= slowest < 1.5 * WAIT, [round(t, 2) for t, _ in results]  # one window, no waves
        # The prober moves the breaker to half-open (1) across its awaits: wait for open (2), not one scrape.
        m = await wait_metrics(url, lambda m: idle(m) and m["atom:pd_breaker_state"] == 2, "idle, the breaker open")
        assert m["atom:pd_breaker_state"] == 2 and m["atom:pd_breaker_transitions_total"] >= 1
        assert_no_block_leaked(m)

        took, exc = await answered_at(url, "while open", time.monotonic())
        assert exc is not None and exc.status_code == 503 and "circuit open" in exc.body["message"]
        assert took < WAIT / 2  # no new window: the pool is known to be down

        worker = spawn(tmp_path, "returning", "prefill", {**BASE, "lanes": 1, "kv_blocks": 2,
                                                         "prefix_cache": False}, kv_port=port)
        try:
            await wait_ready(worker.url, worker)
            await wait_metrics(url, lambda m: m["atom:pd_breaker_state"] == 0, "a probe to close the breaker")
            prompt = "the pool is back"
            out = await client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                                       extra_body={"ignore_eos": True, "return_token_ids": True})
            assert out.choices[0].token_ids == reference_tokens([prompt], 6)[0]
        finally:
            worker.kill()


async def test_a_hung_pool_answers_every_queued_request_503_in_one_window_and_serves_after_it_wakes(
        tmp_path: Path) -> None:
    worker = spawn(tmp_path, "hung", "prefill", {**BASE, "lanes": 1, "kv_blocks": 2, "prefix_cache": False})
    settings = dict(lanes=LANES, kv_blocks=LANES + 1, prefix_cache=False, local_prefill=False,
                    prefill_workers=worker.address, pd_unavailable_wait_seconds=WAIT,
                    pd_response_timeout_seconds=RESPONSE)
    try:
        await wait_ready(worker.url, worker)
        async with in_process("decode", **settings) as (_s, url):
            worker.proc.send_signal(signal.SIGSTOP)  # its kernel still accepts connections; nothing answers
            t0 = time.monotonic()
            results = await asyncio.gather(*(answered_at(url, f"hung request {i}", t0) for i in range(REQUESTS)))
            for _took, exc in results:
                assert exc is not None and exc.status_code == 503 and exc.body["code"] == "prefill_unavailable", exc
            # The response timeout finds the hang (the pool's first failure); the lanes' fetches end with the
            # window from it, and the queued requests at once on the open breaker. In waves, the second wave of
            # lanes would wait out a response timeout of its own.
            took = sorted(t for t, _ in results)
            assert RESPONSE * 0.9 <= took[0] and took[-1] < 2 * RESPONSE, [round(t, 2) for t in took]
            m = await wait_metrics(url, lambda m: idle(m) and m["atom:pd_breaker_state"] != 0, "idle, not closed")
            assert_no_block_leaked(m)
            assert m["atom:pd_source_slots_held"] == 0

            worker.proc.send_signal(signal.SIGCONT)
            await wait_metrics(url, lambda m: m["atom:pd_breaker_state"] == 0, "a probe to close the breaker")
            prompt = "the pool woke up"
            out = await client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                                       extra_body={"ignore_eos": True, "return_token_ids": True})
            assert out.choices[0].token_ids == reference_tokens([prompt], 6)[0]
    finally:
        worker.proc.send_signal(signal.SIGCONT)  # a stopped process ignores the kill's wait otherwise
        worker.kill()


async def test_a_hung_pool_is_found_by_its_silence_a_lease_after_the_request_not_at_the_response_timeout(
        tmp_path: Path) -> None:
    worker = spawn(tmp_path, "silent", "prefill", {**BASE, "lanes": 1, "kv_blocks": 2, "prefix_cache": False})
    lease = 1.0  # the worker acknowledges each heartbeat (every quarter lease): a whole lease of silence is a hang
    settings = dict(lanes=LANES, kv_blocks=LANES + 1, prefix_cache=False, local_prefill=False,
                    prefill_workers=worker.address, pd_unavailable_wait_seconds=WAIT,
                    pd_response_timeout_seconds=60.0, pd_lease_seconds=lease)
    try:
        await wait_ready(worker.url, worker)
        async with in_process("decode", **settings) as (_s, url):
            assert (await answered_at(url, "a live worker is not silent", time.monotonic()))[1] is None
            worker.proc.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            results = await asyncio.gather(*(answered_at(url, f"silent {i}", t0) for i in range(REQUESTS)))
            for _took, exc in results:
                assert exc is not None and exc.status_code == 503 and exc.body["code"] == "prefill_unavailable", exc
            assert any("went silent" in exc.body["message"] for _, exc in results), [e.body for _, e in results]
            # Each lane's attempt fails a lease after it asked (the worker answered nothing, not even an
            # acknowledgement); the window of the first failure bounds the rest, so all end within one window of
            # it, far before the response timeout.
            took = sorted(t for t, _ in results)
            assert lease * 0.9 <= took[0] and took[-1] < lease + 1.5 * WAIT, [round(t, 2) for t in took]
            m = await wait_metrics(url, idle, "idle")
            assert_no_block_leaked(m)
            assert m["atom:pd_source_slots_held"] == 0
    finally:
        worker.proc.send_signal(signal.SIGCONT)
        worker.kill()
