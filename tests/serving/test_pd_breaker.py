"""The prefill pool's circuit breaker on real servers: with the pool down, more requests than lanes all get a
503 ``prefill_unavailable`` within one wait window of the first failure (not one window per wave of lanes), a
request that comes while the breaker is open fails at once, and a worker that comes back is found by the
half-open probe and serves token-exact at once."""

from __future__ import annotations

import asyncio
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
        m = await wait_metrics(url, idle, "idle")
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
