"""The figures an autoscaler reads, against a paced prefill worker whose speed is known: prompts queued and
running and their tokens, busy seconds, queue time; on the decode side arrivals at enqueue, lanes waiting for a
remote KV, the fetch time; and the in-flight count that tells a drained pod is idle."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import yaml
from atom_localcluster.cluster import free_port

from tests import pacing
from tests.serving.conftest import BASE, MODEL, REPO, Proc, _camel, client, in_process, scrape, wait_metrics, wait_ready

pytestmark = pytest.mark.asyncio(loop_scope="session")

MS_PER_TOKEN = 10.0
PROMPT = "y" * 40
TOKENS = len(PROMPT) + 1  # byte tokens, with the digit that makes each prompt its own: 0.41 s at the pace above


def paced_worker(tmp: Path) -> Proc:
    kv_port = free_port()
    settings = {**BASE, "lanes": 1, "kv_blocks": 2, "prefix_cache": False, "pd_kv_port": kv_port}
    config = tmp / "paced.yaml"
    config.write_text(yaml.safe_dump({_camel(k): v for k, v in settings.items()}))
    port = free_port()
    log = tmp / "paced.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.pacing", "serve", "--role", "prefill", "--config", str(config),
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **pacing.env(prefill_ms_per_token=MS_PER_TOKEN)},
    )  # fmt: skip
    return Proc(proc, port, log, kv_port)


@asynccontextmanager
async def paced_pd(tmp: Path, lanes: int) -> AsyncIterator[tuple[Proc, str]]:
    """A paced prefill worker and a remote-only decode server in this process using it."""
    worker = paced_worker(tmp)
    try:
        await wait_ready(worker.url, worker)
        settings = dict(lanes=lanes, kv_blocks=lanes + 1, prefix_cache=False, local_prefill=False,
                        prefill_workers=worker.address, speculative_tokens=0)  # fmt: skip
        async with in_process("decode", **settings) as (_server, url):
            yield worker, url
    finally:
        worker.kill()


async def test_prefill_and_decode_signals_follow_a_burst(tmp_path: Path) -> None:
    async with paced_pd(tmp_path, lanes=4) as (worker, url):
        c = client(url)
        burst = [
            asyncio.create_task(c.completions.create(model=MODEL, prompt=PROMPT + str(i), max_tokens=4,
                                                     extra_body={"ignore_eos": True}))  # fmt: skip
            for i in range(4)
        ]
        # One prompt computes, three queue behind it (the worker computes one at a time).
        queued = await wait_metrics(
            worker.url, lambda m: m["vllm:num_requests_waiting"] == 3 and m["vllm:num_requests_running"] == 1,
            "three prompts queued behind one", timeout=20,
        )  # fmt: skip
        assert queued["atom:prefill_tokens_waiting"] == 3 * TOKENS
        assert queued["atom:requests_in_flight"] == 4
        decode = await scrape(url)
        assert decode["atom:arrived_requests_total"] == 4 and decode["atom:pd_waiting_for_kv"] == 4
        assert decode["vllm:num_requests_running"] == 4
        done = await asyncio.gather(*burst)
        assert all(r.usage.completion_tokens == 4 for r in done)

        after = await scrape(worker.url)
        assert after["vllm:num_requests_waiting"] == after["vllm:num_requests_running"] == 0
        assert after["atom:prefill_tokens_waiting"] == 0 and after["atom:requests_in_flight"] == 0
        tokens = after["atom:prefill_tokens_computed_total"]
        assert tokens == 4 * TOKENS
        # Busy at least the pace's share of every token, and the queue's waits add up: 0 + 1 + 2 + 3 prefills.
        assert after["atom:prefill_busy_seconds_total"] >= tokens * MS_PER_TOKEN / 1000
        assert after["vllm:request_queue_time_seconds_count"] == 4
        assert after["vllm:request_queue_time_seconds_sum"] >= 6 * TOKENS * MS_PER_TOKEN / 1000 * 0.9
        decode = await scrape(url)
        assert decode["atom:arrived_prompt_tokens_total"] == decode["vllm:prompt_tokens_total"] == tokens
        assert decode["atom:pd_waiting_for_kv"] == 0 and decode["atom:requests_in_flight"] == 0
        assert decode["atom:pd_fetch_seconds_count"] == 4
        # Decode time starts at the first token: the remote prefill's wait is not in it.
        assert decode["atom:decoded_max_tokens_total"] == decode["atom:arrived_max_tokens_total"] == 4 * 4
        assert 0 < decode["atom:request_decode_seconds_total"] < decode["atom:pd_fetch_seconds_sum"]
        assert decode["atom:pd_fetch_seconds_sum"] >= after["vllm:request_queue_time_seconds_sum"]


async def test_a_prompt_cancelled_while_queued_leaves_the_queue(tmp_path: Path) -> None:
    async with paced_pd(tmp_path, lanes=2) as (worker, url):
        c = client(url)
        long = "z" * 200  # 2 s at the pace
        first = asyncio.create_task(c.completions.create(model=MODEL, prompt=long, max_tokens=2))
        second = asyncio.create_task(c.completions.create(model=MODEL, prompt=long + "!", max_tokens=2))
        await wait_metrics(worker.url, lambda m: m["vllm:num_requests_waiting"] == 1, "one queued", timeout=20)
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        await first
        m = await wait_metrics(worker.url, lambda m: m["atom:requests_in_flight"] == 0, "idle", timeout=30)
        assert m["vllm:num_requests_waiting"] == m["vllm:num_requests_running"] == 0
        assert m["atom:prefill_tokens_waiting"] == 0
