"""A prefill worker killed in the middle of a shipment: the request is retried on the other worker and finishes
token-exact, later requests succeed, and no block, slot or pin is left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.serving.conftest import (
    BASE,
    MODEL,
    Proc,
    assert_no_block_leaked,
    client,
    idle,
    in_process,
    reference_tokens,
    scrape,
    spawn,
    wait_metrics,
    wait_ready_sync,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
PROMPTS = [f"Request number {i} wants its KV shipped." for i in range(6)]


@pytest.fixture
def stalling_worker(tmp_path: Path) -> Proc:
    """A prefill worker that stops every frame after its first 200 bytes (and is killed by the test)."""
    proc = spawn(tmp_path, "stalling", "prefill", {**BASE, "lanes": 1, "kv_blocks": 3, "prefix_cache": False},
                 faults="stall_after_bytes=200")
    try:
        wait_ready_sync(proc)
        yield proc
    finally:
        proc.kill()


async def test_worker_killed_mid_transfer_is_retried_on_another_and_nothing_leaks(
        stalling_worker: Proc, prefill_pair: list[Proc]) -> None:
    healthy = prefill_pair[0]
    expected = dict(zip(PROMPTS, reference_tokens(PROMPTS, 8), strict=True))
    async with in_process("decode", lanes=2, kv_blocks=4, prefix_cache=True, local_prefill=False,
                          prefill_workers=f"{stalling_worker.address},{healthy.address}") as (_s, url):
        c = client(url)

        async def ask(prompt: str) -> list[int]:
            out = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True, "return_token_ids": True})
            return out.choices[0].token_ids

        # Work is spread over both workers, so one of the first requests lands on the stalling one.
        tasks = [asyncio.create_task(ask(p)) for p in PROMPTS[:2]]
        m = await wait_metrics(stalling_worker.url, lambda m: m["atom:prefill_sends_started_total"] >= 1,
                               "a shipment to stall mid-frame")
        assert m["atom:prefill_bytes_sent_total"] == 0  # counted when the send ends: it has not
        stalling_worker.kill()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert results == [expected[p] for p in PROMPTS[:2]]
        assert await asyncio.wait_for(asyncio.gather(*(ask(p) for p in PROMPTS[2:])), 60) == [
            expected[p] for p in PROMPTS[2:]]
        m = await wait_metrics(url, idle, "idle")
        assert m["atom:pd_fetch_retries_total"] >= 1 and m["atom:pd_fetch_failures_total"] >= 1
        assert m["atom:requests_failed_total"] == 0
        assert_no_block_leaked(m)


async def test_with_one_worker_a_killed_worker_gives_503_and_nothing_leaks(stalling_worker: Proc) -> None:
    async with in_process("decode", lanes=1, kv_blocks=2, prefix_cache=False, local_prefill=False,
                          prefill_workers=stalling_worker.address) as (_s, url):
        task = asyncio.create_task(client(url).completions.create(model=MODEL, prompt="doomed", max_tokens=4))
        await wait_metrics(stalling_worker.url, lambda m: m["atom:prefill_sends_started_total"] >= 1, "a stall")
        stalling_worker.kill()
        with pytest.raises(Exception) as info:  # noqa: PT011 - checked below
            await asyncio.wait_for(task, 60)
        assert getattr(info.value, "status_code", None) == 503, info.value
        assert "prefill failed on 1 worker(s)" in info.value.body["message"]
        m = await wait_metrics(url, idle, "idle")
        assert_no_block_leaked(m)
        assert (await scrape(url))["atom:requests_failed_total"] == 1
