"""Load: 200 concurrent requests on decode + two prefill workers, with random client cancels and bad inputs.
Every valid request completes token-exact or was cancelled by its client, none is lost, no block leaks."""

from __future__ import annotations

import asyncio
import random

import httpx2
import openai
import pytest

from tests.serving.conftest import (
    MODEL,
    Proc,
    assert_no_block_leaked,
    client,
    idle,
    in_process,
    reference_tokens,
    scrape,
    wait_metrics,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
N = 200
MAX_TOKENS = 10
STEMS = ["The engine said: ", "Lanes and blocks, ", "A prefix cache hit ", "x"]
POOL = [stem + tail for stem in STEMS for tail in ("one", "two and three", "four five six seven", "")]


async def test_200_concurrent_requests_with_cancels_and_bad_inputs(prefill_pair: list[Proc]) -> None:
    rng = random.Random(1234)
    expected = dict(zip(POOL, reference_tokens(POOL, MAX_TOKENS), strict=True))
    async with in_process("decode", lanes=4, kv_blocks=7, prefix_cache=True, local_prefill=False,
                          max_waiting=256, prefill_workers=",".join(w.address for w in prefill_pair)) as (_s, url):
        before = await scrape(url)
        c = client(url, http_client=openai.DefaultAsyncHttpxClient(limits=httpx2.Limits(max_connections=N + 10)))

        async def valid(prompt: str, n: int, stream: bool) -> list[int]:
            args = dict(model=MODEL, prompt=prompt, max_tokens=n, temperature=0,
                        extra_body={"ignore_eos": True, "return_token_ids": True})
            if not stream:
                return (await c.completions.create(**args)).choices[0].token_ids
            chunks = await c.completions.create(**args, stream=True)
            return [t async for ch in chunks for t in ch.choices[0].token_ids]

        # Each bad input with the 4xx it gets: an unknown model is 404 model_not_found (as OpenAI and vLLM answer).
        bad_inputs = [(dict(model="other", prompt="x"), openai.NotFoundError),
                      (dict(model=MODEL, prompt="x" * 600), openai.BadRequestError),
                      (dict(model=MODEL, prompt="x", max_tokens=-1), openai.BadRequestError),
                      (dict(model=MODEL, prompt="x", temperature="hot"), openai.BadRequestError)]
        jobs = []
        for _ in range(N):
            roll = rng.random()
            if roll < 0.1:
                bad, error = rng.choice(bad_inputs)
                jobs.append(("bad", c.completions.create(**bad), error, None))
            else:
                prompt, n = rng.choice(POOL), rng.randint(1, MAX_TOKENS)
                cancel_after = rng.uniform(0.0, 0.5) if roll < 0.3 else None
                jobs.append(("valid", valid(prompt, n, rng.random() < 0.3), (prompt, n), cancel_after))
        tasks = [asyncio.create_task(coro) for _kind, coro, _want, _cancel in jobs]
        for task, (_kind, _coro, _want, cancel_after) in zip(tasks, jobs, strict=True):
            if cancel_after is not None:
                asyncio.get_running_loop().call_later(cancel_after, task.cancel)
        done, pending = await asyncio.wait(tasks, timeout=240)
        assert not pending, f"{len(pending)} requests never finished"
        outcome = {"exact": 0, "cancelled": 0, "refused": 0}
        for task, (kind, _coro, want, _cancel) in zip(tasks, jobs, strict=True):
            if task.cancelled():
                assert kind == "valid" and _cancel is not None, "only the client's own cancels may end a request"
                outcome["cancelled"] += 1
            elif kind == "bad":
                assert isinstance(task.exception(), want), task.exception()
                outcome["refused"] += 1
            else:
                assert task.exception() is None, task.exception()
                prompt, n = want
                assert task.result() == expected[prompt][:n], prompt
                outcome["exact"] += 1
        assert sum(outcome.values()) == N and outcome["exact"] > N / 2, outcome
        m = await wait_metrics(url, idle, "the engine to drain", 60)
        assert_no_block_leaked(m)
        ended = sum(m[k] - before[k] for k in ("atom:requests_finished_total", "atom:requests_cancelled_total"))
        assert m["atom:requests_failed_total"] == before["atom:requests_failed_total"]
        # Every request the engine queued ended: finished (>= the exact ones) or cancelled.
        assert ended >= outcome["exact"] and m["atom:requests_finished_total"] - before[
            "atom:requests_finished_total"] >= outcome["exact"]
        print(f"load outcome: {outcome}")
