"""Prefill/decode disaggregation: a standalone server, decode + one prefill worker and decode + two workers give
the same tokens with the prefix cache on and off; a prefix hit ships fewer bytes; work spreads over workers;
corrupt and late shipments are refused with a clear 503 and leave nothing held."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import openai
import pytest
from atom_engine.pd.wire import ACK, REQUEST, message

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

SHARED = "Once upon a time, in a land of static shapes and compiled graphs, "
PROMPTS = [SHARED + "a decoder waited.", SHARED + "a prefill worker hummed.", "short", "x" * 90,
           SHARED + "a decoder waited. Then it decoded.", "The quick brown fox", SHARED, "Once upon a time"]
MAX_TOKENS = 12


async def complete_all(url: str, prompts: list[str], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    c = client(url)  # closed after the test by conftest._close_clients (closing twice breaks later sockets)

    async def one(p: str) -> list[int]:
        out = await c.completions.create(model=MODEL, prompt=p, max_tokens=max_tokens, temperature=0,
                                         extra_body={"ignore_eos": True, "return_token_ids": True})
        return out.choices[0].token_ids

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def decode_settings(workers: list[Proc], prefix_cache: bool, **extra: object) -> dict:
    return dict(lanes=2, kv_blocks=5 if prefix_cache else 4, prefix_cache=prefix_cache, local_prefill=False,
                prefill_workers=",".join(w.address for w in workers), **extra)


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["cache-off", "cache-on"])
async def test_standalone_decode_one_worker_and_two_workers_give_identical_tokens(
        prefill_pair: list[Proc], prefix_cache: bool) -> None:
    expected = reference_tokens(PROMPTS, MAX_TOKENS)
    async with in_process("standalone", lanes=2, kv_blocks=5 if prefix_cache else 4,
                          prefix_cache=prefix_cache) as (_s, url):
        assert await complete_all(url, PROMPTS) == expected
        assert await complete_all(url, PROMPTS) == expected  # second round: prefix hits when the cache is on
    for workers in (prefill_pair[:1], prefill_pair):
        before = [await scrape(w.url) for w in workers]
        async with in_process("decode", **decode_settings(workers, prefix_cache)) as (server, url):
            assert await complete_all(url, PROMPTS) == expected
            assert await complete_all(url, PROMPTS) == expected
            m = await wait_metrics(url, idle, "idle")
            assert_no_block_leaked(m)
            assert m["atom:prefill_tokens_computed_total"] == 0  # remote-only: the decode side never prefills
            assert m["atom:pd_remote_prefills_total"] == 2 * len(PROMPTS)
            if prefix_cache:
                assert m["vllm:prefix_cache_hits_total"] > 0
        served = [(await scrape(w.url))["atom:prefill_requests_total"] - b["atom:prefill_requests_total"]
                  for w, b in zip(workers, before, strict=True)]
        assert sum(served) == 2 * len(PROMPTS) and all(n > 0 for n in served), served  # spread over workers


async def test_a_prefix_hit_ships_only_the_uncached_suffix(prefill_pair: list[Proc]) -> None:
    first, second = SHARED + "alpha", SHARED + "alpha and beta"
    shipped = {}
    for prefix_cache in (False, True):
        async with in_process("decode", **decode_settings(prefill_pair[:1], prefix_cache)) as (_s, url):
            await complete_all(url, [first])
            before = await scrape(url)
            assert await complete_all(url, [second]) == reference_tokens([second], MAX_TOKENS)
            after = await scrape(url)
            shipped[prefix_cache] = after["atom:pd_kv_bytes_imported_total"] - before["atom:pd_kv_bytes_imported_total"]
            tokens = after["atom:pd_remote_prefill_tokens_total"] - before["atom:pd_remote_prefill_tokens_total"]
            if prefix_cache:
                # The hit covers the first request's prompt and output tokens that match the second prompt.
                assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] >= len(first)
                assert tokens == len(second) - (after["vllm:prefix_cache_hits_total"]
                                                - before["vllm:prefix_cache_hits_total"])
            else:
                assert tokens == len(second)
    assert shipped[True] < shipped[False] / 3, shipped


async def test_a_corrupt_shipment_is_refused_with_503_and_nothing_held(prefill_pair: list[Proc]) -> None:
    async with in_process("decode", **decode_settings(prefill_pair[:1], True)) as (_s, url):
        with pytest.raises(openai.APIStatusError) as info:
            await client(url).completions.create(model=MODEL, prompt="CORRUPT me", max_tokens=4)
        assert info.value.status_code == 503 and info.value.body["code"] == "prefill_unavailable"
        assert "checksum mismatch" in info.value.body["message"]
        m = await wait_metrics(url, idle, "idle")
        assert_no_block_leaked(m)
        assert m["vllm:generation_tokens_total"] == 0  # nothing of the corrupt KV was used
        assert await complete_all(url, PROMPTS[:2]) == reference_tokens(PROMPTS[:2], MAX_TOKENS)


@pytest.mark.parametrize(("marker", "needle"), [
    ("TRUNCATE", "the stream ended after"),
    ("OVERSIZE", "header of 1073741824 bytes exceeds"),
])
async def test_a_truncated_or_oversize_frame_is_refused_with_503_and_nothing_held(
        prefill_pair: list[Proc], marker: str, needle: str) -> None:
    async with in_process("decode", **decode_settings(prefill_pair[:1], True, pd_attempts=1)) as (_s, url):
        with pytest.raises(openai.APIStatusError) as info:
            await client(url).completions.create(model=MODEL, prompt=f"{marker} me", max_tokens=4)
        assert info.value.status_code == 503 and info.value.body["code"] == "prefill_unavailable"
        assert needle in info.value.body["message"]
        m = await wait_metrics(url, idle, "idle")
        assert_no_block_leaked(m)
        assert m["vllm:generation_tokens_total"] == 0
        assert await complete_all(url, PROMPTS[:2]) == reference_tokens(PROMPTS[:2], MAX_TOKENS)


async def test_garbage_on_the_kv_port_is_refused_and_the_worker_serves_on(prefill_pair: list[Proc]) -> None:
    worker = prefill_pair[0]
    reader, writer = await asyncio.open_connection("127.0.0.1", worker.kv_port)
    # Bytes of no protocol (an HTTP request on this port is answered in HTTP: tests/serving/test_pd_miswired.py).
    writer.write(b"\x16\x03\x01garbage" + bytes(range(256)) * 8)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)  # an error message, then the worker closes
    writer.close()
    assert b"not a KV transport message" in answer
    async with in_process("decode", **decode_settings([worker], False)) as (_s, url):
        assert await complete_all(url, PROMPTS[:1]) == reference_tokens(PROMPTS[:1], MAX_TOKENS)
    assert "Traceback" not in worker.log.read_text()


async def test_a_corrupt_shipment_is_retried_on_the_other_worker(prefill_pair: list[Proc]) -> None:
    # Both workers corrupt CORRUPT prompts: the retry fails too and the error names both attempts.
    async with in_process("decode", **decode_settings(prefill_pair, False)) as (_s, url):
        with pytest.raises(openai.APIStatusError) as info:
            await client(url).completions.create(model=MODEL, prompt="CORRUPT again", max_tokens=4)
        assert info.value.status_code == 503 and "on 2 worker(s)" in info.value.body["message"]
        m = await wait_metrics(url, idle, "idle")
        assert m["atom:pd_fetch_retries_total"] == 1 and m["atom:pd_fetch_failures_total"] == 2
        assert_no_block_leaked(m)


async def test_a_worker_that_does_not_answer_in_time_gives_503_and_frees_everything(
        prefill_pair: list[Proc]) -> None:
    settings = decode_settings(prefill_pair[:1], False, pd_response_timeout_seconds=0.5, pd_attempts=1)
    async with in_process("decode", **settings) as (_s, url):
        with pytest.raises(openai.APIStatusError) as info:
            await client(url).completions.create(model=MODEL, prompt="HOLD:never; late", max_tokens=4)
        assert info.value.status_code == 503 and "timed out" in info.value.body["message"]
        assert_no_block_leaked(await wait_metrics(url, idle, "idle"))
        assert await complete_all(url, PROMPTS[:2]) == reference_tokens(PROMPTS[:2], MAX_TOKENS)


async def test_a_request_a_worker_refuses_gets_that_4xx_without_a_retry_and_the_pool_stays_closed(
        prefill_pair: list[Proc]) -> None:
    # The workers run maxSeqLen 512; this decode pod admits longer prompts, which a worker refuses (its 400).
    prompt = "a prompt too long for the workers " * 20
    assert 512 < len(prompt) < 1024
    async with in_process("decode", **decode_settings(prefill_pair, False, max_seq_len=1024)) as (_s, url):
        with pytest.raises(openai.APIStatusError) as info:
            await client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=4)
        assert info.value.status_code == 400 and info.value.body["code"] == "invalid_request"
        assert "maxSeqLen is 512" in info.value.body["message"]
        m = await wait_metrics(url, idle, "idle")
        assert m["atom:pd_fetch_attempts_total"] == 1 and m["atom:pd_fetch_retries_total"] == 0  # one worker asked
        assert m["atom:pd_fetch_failures_total"] == 0 and m["atom:pd_breaker_state"] == 0
        assert_no_block_leaked(m)
        assert await complete_all(url, PROMPTS[:2]) == reference_tokens(PROMPTS[:2], MAX_TOKENS)


async def open_kv(worker: Proc, prompt: bytes, request_id: str, lease: float = 10.0, receive_buffer: int = 0
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A decoder's connection to a worker's KV port, its request sent (and no heartbeat ever); with
    ``receive_buffer``, a socket that buffers only that much of what it is sent."""
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", worker.kv_port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(message(REQUEST, {"request_id": request_id, "prompt_token_ids": list(prompt), "start": 0,
                                   "prompt_logprobs": None, "lease_seconds": lease}))
    await writer.drain()
    return reader, writer


async def answer_kind(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """The kind of the worker's answer (its first 4 bytes), past the acknowledgements that come before it."""
    first = ACK
    while first == ACK:
        first = await asyncio.wait_for(reader.readexactly(1), timeout)
    return first + await asyncio.wait_for(reader.readexactly(3), timeout)


async def test_a_decoder_that_goes_away_pins_nothing_on_the_prefill_worker(prefill_pair: list[Proc],
                                                                           hold_dir: Path) -> None:
    worker = prefill_pair[1]
    before = await scrape(worker.url)
    _reader, writer = await open_kv(worker, b"HOLD:dead-decoder; a prompt", "gone-1")
    await wait_metrics(worker.url, lambda m: m["atom:prefill_in_flight"] == 1, "the worker to take the request")
    writer.close()  # the decoder dies while its KV is being produced
    await wait_metrics(worker.url, lambda m: m["atom:prefill_in_flight"] == 0, "the worker to drop it")
    (hold_dir / "dead-decoder").touch()
    # The worker dropped the work of the dead decoder: nothing computed, no block held, and it serves on.
    async with in_process("decode", **decode_settings([worker], False)) as (_s, url):
        assert await complete_all(url, PROMPTS[:1]) == reference_tokens(PROMPTS[:1], MAX_TOKENS)
    m = await scrape(worker.url)
    assert m["atom:kv_blocks_lanes"] == 0
    assert m["atom:prefill_tokens_computed_total"] - before["atom:prefill_tokens_computed_total"] == len(
        PROMPTS[0])  # only the live request's prompt
    assert m["atom:prefill_sends_started_total"] - before["atom:prefill_sends_started_total"] == 1
