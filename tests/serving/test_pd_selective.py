"""Selective disaggregation (localPrefill with prefill workers): a prompt whose uncached suffix is short is
prefilled by the decode pod, a long one by a worker, and with the pool's breaker open every prompt is prefilled
locally, so the decode pod serves on; a prompt whose fetch fails (the pool's first window, or every worker failed
it) is prefilled locally too; outputs are token-exact either way."""

from __future__ import annotations

import pytest
from atom_localcluster.cluster import free_port

from tests.serving.conftest import (
    Proc,
    assert_no_block_leaked,
    idle,
    in_process,
    reference_tokens,
    scrape,
    wait_metrics,
)
from tests.serving.test_pd import complete_all

pytestmark = pytest.mark.asyncio(loop_scope="session")
THRESHOLD = 40  # tokens (the built-in tokenizer: one per byte)
SHORT, LONG = "short prompt, local", "a prompt long enough to be worth shipping from a worker"


def selective(workers: str, **extra: object) -> dict:
    return dict(lanes=2, kv_blocks=4, prefix_cache=False, local_prefill=True, prefill_workers=workers,
                remote_prefill_min_tokens=THRESHOLD, **extra)


async def test_short_suffixes_prefill_here_and_long_ones_on_a_worker(prefill_pair: list[Proc]) -> None:
    assert len(SHORT) < THRESHOLD <= len(LONG)
    worker = prefill_pair[0]
    before = await scrape(worker.url)
    async with in_process("decode", **selective(worker.address)) as (_s, url):
        assert await complete_all(url, [SHORT, LONG]) == reference_tokens([SHORT, LONG], 12)
        m = await wait_metrics(url, idle, "idle")
        assert m["atom:pd_local_prefills_total"] == 1 and m["atom:pd_remote_prefills_total"] == 1
        assert m["atom:prefill_tokens_computed_total"] == len(SHORT)  # only the short prompt was prefilled here
        assert_no_block_leaked(m)
    shipped = (await scrape(worker.url))["atom:prefill_tokens_computed_total"]
    assert shipped - before["atom:prefill_tokens_computed_total"] == len(LONG)


async def test_with_the_pool_down_the_decode_pod_prefills_by_itself() -> None:
    down = f"127.0.0.1:{free_port()}"  # nothing listens
    async with in_process("decode", **selective(down, pd_unavailable_wait_seconds=0.5)) as (_s, url):
        # The first long prompt meets the pool's first failure: once its window has passed it is prefilled here...
        assert await complete_all(url, [LONG]) == reference_tokens([LONG], 12)
        m = await wait_metrics(url, lambda m: m["atom:pd_breaker_state"] == 2, "the breaker to open")
        # ...then, the breaker open, long prompts are prefilled here without asking the pool.
        assert await complete_all(url, [LONG, LONG + " again"]) == reference_tokens([LONG, LONG + " again"], 12)
        m = await wait_metrics(url, idle, "idle")
        assert m["atom:pd_local_prefills_total"] == 3 and m["atom:pd_remote_prefills_total"] == 1
        assert_no_block_leaked(m)


async def test_a_long_prompt_every_worker_fails_is_prefilled_here_token_exact(prefill_pair: list[Proc]) -> None:
    # Both workers fail FAILME prompts (a 500): the fetch fails with the breaker still closed, and this pod, which
    # may prefill, serves the prompt itself instead of answering 503.
    prompt = "FAILME: " + LONG
    async with in_process("decode", **selective(",".join(w.address for w in prefill_pair))) as (_s, url):
        assert await complete_all(url, [prompt]) == reference_tokens([prompt], 12)
        m = await wait_metrics(url, idle, "idle")
        assert m["atom:pd_fetch_failures_total"] == 2 and m["atom:pd_breaker_state"] == 0
        assert m["atom:pd_local_prefills_total"] == 1 and m["atom:pd_remote_prefills_total"] == 1
        assert m["atom:prefill_tokens_computed_total"] == len(prompt)
        assert_no_block_leaked(m)
        assert await complete_all(url, [LONG]) == reference_tokens([LONG], 12)  # the next one goes to a worker
