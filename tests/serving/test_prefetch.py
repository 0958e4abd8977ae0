"""B1 prefetch (one lane, remote-only): {success, cancel, producer error} x {prefix cache off, on}. Outputs stay
exact; the source slot is held until the import (after a cancel or an error, until the producer completed);
the engine is not idle while a prefetch is held; a cancel stops the prefetch's producer; a prefetched request
is never fetched twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest
import pytest_asyncio

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

LONG = 300  # tokens the lane decodes while the next request is prefetched
CACHED = "A shared opening that the prefix cache keeps for later requests: "


@pytest_asyncio.fixture(loop_scope="session", params=[False, True], ids=["cache-off", "cache-on"])
async def decode(request: pytest.FixtureRequest, prefill_pair: list[Proc]):  # noqa: ANN201
    prefix_cache = request.param
    async with in_process("decode", lanes=1, kv_blocks=3 if prefix_cache else 2, prefix_cache=prefix_cache,
                          local_prefill=False, prefetch_next=True,
                          prefill_workers=prefill_pair[0].address) as (_server, url):
        if prefix_cache:  # a cache entry for the prefetched prompts to hit
            await complete(url, CACHED + "warm", 2)
        yield url, prefix_cache


async def complete(url: str, prompt: str, max_tokens: int) -> list[int]:
    out = await client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                               extra_body={"ignore_eos": True, "return_token_ids": True})
    return out.choices[0].token_ids


async def start_long(url: str) -> tuple[openai.AsyncStream, asyncio.Task]:
    """A request that holds the only lane for LONG tokens; returns once it decodes, and a task reading the rest."""
    stream = await client(url).completions.create(model=MODEL, prompt="Hold the lane, please.", max_tokens=LONG,
                                                  temperature=0, stream=True,
                                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    first = await anext(aiter(stream))

    async def rest() -> list[int]:
        return list(first.choices[0].token_ids) + [t async for ch in stream for t in ch.choices[0].token_ids]

    return stream, asyncio.create_task(rest())


async def test_prefetch_success_imports_once_and_is_exact(decode: tuple[str, bool]) -> None:
    url, prefix_cache = decode
    prompt = CACHED + "prefetched and exact"
    before = await scrape(url)
    _stream, long = await start_long(url)
    nxt = asyncio.create_task(complete(url, prompt, 8))
    # The prefetched KV has arrived while the lane still decodes: the slot stays reserved until the import.
    m = await wait_metrics(url, lambda m: m["atom:prefetch_ready"] == 1, "a prefetched shipment", 60)
    assert m["atom:pd_source_slots_held"] == 1 and m["atom:engine_idle"] == 0
    assert m["vllm:num_requests_waiting"] == 1 and m["vllm:num_requests_running"] == 1
    assert await asyncio.wait_for(nxt, 60) == reference_tokens([prompt], 8)[0]
    assert await asyncio.wait_for(long, 60) == reference_tokens(["Hold the lane, please."], LONG)[0]
    m = await wait_metrics(url, idle, "idle")
    delta = {k: m[k] - before.get(k, 0) for k in m if k.startswith("atom:")}
    assert delta["atom:prefetch_started_total"] == 1 and delta["atom:prefetch_hits_total"] == 1
    assert delta["atom:pd_remote_prefills_total"] == 2  # the prefetched request was not fetched again
    if prefix_cache:  # only the uncached suffix was shipped
        assert delta["atom:prefetch_cached_tokens_total"] >= len(CACHED)
        assert delta["atom:pd_remote_prefill_tokens_total"] == (
            len("Hold the lane, please.") + len(prompt) - delta["atom:prefetch_cached_tokens_total"])
    else:
        assert delta["atom:prefetch_cached_tokens_total"] == 0
    assert_no_block_leaked(m)


async def test_a_cancelled_prefetch_stops_its_producer_and_frees_its_slot(
        decode: tuple[str, bool], prefill_pair: list[Proc], hold_dir: Path) -> None:
    url, prefix_cache = decode
    worker = prefill_pair[0].url
    name = f"cancel-{int(prefix_cache)}"
    before = await scrape(url)
    _stream, long = await start_long(url)
    doomed = asyncio.create_task(complete(url, CACHED + f"HOLD:{name}; then cancelled", 8))
    await wait_metrics(url, lambda m: m["atom:prefetch_started_total"] == before["atom:prefetch_started_total"] + 1,
                       "the prefetch to start")
    await wait_metrics(worker, lambda m: m["atom:prefill_in_flight"] == 1, "the worker to hold the prefetch")
    doomed.cancel()  # the client goes away while its KV is still being produced
    await asyncio.wait_for(long, 60)
    m = await wait_metrics(url, lambda m: m["atom:prefetch_cancelled_total"]
                           == before["atom:prefetch_cancelled_total"] + 1 and idle(m),
                           "the cancel and the long request to end", 60)
    # The cancel stopped the fetch: once it stopped, the slot is free, though the worker's hold never ended.
    assert m["vllm:num_requests_waiting"] == 0 and m["atom:kv_blocks_lanes"] == 0
    assert m["atom:pd_source_slots_held"] == 0
    assert m["atom:kv_blocks_pinned"] == 0  # the cache entry the prefetch relied on is unpinned at once
    w = await wait_metrics(worker, lambda m: m["atom:prefill_in_flight"] == 0, "the worker to drop the prefetch")
    assert_no_block_leaked(m)
    (hold_dir / name).touch()
    assert m["atom:prefetch_hits_total"] == before["atom:prefetch_hits_total"]
    prompt = CACHED + "after a cancel"
    assert await complete(url, prompt, 6) == reference_tokens([prompt], 6)[0]
    after = await scrape(url)
    # Two fetches for the long and the cancelled request, one for the last: the cancelled one never again.
    assert after["atom:pd_remote_prefills_total"] - before["atom:pd_remote_prefills_total"] == 3
    assert (await scrape(worker))["atom:prefill_sends_started_total"] == w["atom:prefill_sends_started_total"] + 1


async def test_producer_error_fails_only_the_prefetched_request_and_frees_the_slot(
        decode: tuple[str, bool]) -> None:
    url, _prefix_cache = decode
    before = await scrape(url)
    _stream, long = await start_long(url)
    failing = asyncio.create_task(complete(url, CACHED + "FAILME please", 8))
    await wait_metrics(url, lambda m: m["atom:prefetch_started_total"] == before["atom:prefetch_started_total"] + 1,
                       "the prefetch to start")
    with pytest.raises(openai.APIStatusError) as info:
        await asyncio.wait_for(failing, 60)
    assert info.value.status_code == 503 and info.value.body["code"] == "prefill_unavailable"
    assert "injected prefill failure" in info.value.body["message"]
    assert await asyncio.wait_for(long, 60) == reference_tokens(["Hold the lane, please."], LONG)[0]
    m = await wait_metrics(url, idle, "idle")
    assert m["atom:prefetch_failed_total"] == before["atom:prefetch_failed_total"] + 1
    assert_no_block_leaked(m)
    prompt = CACHED + "after an error"
    assert await complete(url, prompt, 6) == reference_tokens([prompt], 6)[0]
