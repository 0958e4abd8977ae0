"""A miswired PD pair says what is wrong, from both sides: a decoder whose prefillWorkers names a worker's HTTP port
is told to name the KV port (a 503 that never reads as corrupt), and an HTTP client on a worker's KV port gets an
HTTP 400 with an OpenAI error body saying the same, rather than a dropped connection."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request

import openai
import pytest

from tests.serving.conftest import MODEL, Proc, assert_no_block_leaked, client, idle, in_process, wait_metrics

pytestmark = pytest.mark.asyncio(loop_scope="session")

SENTENCE = "prefillWorkers must name the worker's KV port (pdKvPort, 8001 by default), not its HTTP port"


async def test_a_decoder_dialing_the_workers_http_port_is_told_to_name_the_kv_port(prefill_pair: list[Proc]) -> None:
    http = f"127.0.0.1:{prefill_pair[0].port}"  # the worker's HTTP port, as a person wiring it by hand writes
    async with in_process("decode", lanes=2, kv_blocks=4, local_prefill=False, prefill_workers=http,
                          pd_unavailable_wait_seconds=1.0) as (_s, url):
        with pytest.raises(openai.APIStatusError) as info:
            await client(url).completions.create(model=MODEL, prompt="Hello", max_tokens=4)
        message = info.value.body["message"]
        assert info.value.status_code == 503, message
        assert f"{http} answers HTTP: {SENTENCE}" in message, message
        assert "corrupt" not in message, message
        assert_no_block_leaked(await wait_metrics(url, idle, "idle"))


def _http_get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_an_http_request_on_the_kv_port_gets_a_400_naming_both_ports(prefill_pair: list[Proc]) -> None:
    worker = prefill_pair[0]
    status, body = await asyncio.to_thread(_http_get, f"http://127.0.0.1:{worker.kv_port}/v1/models")
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "wrong_port", body
    assert "KV transport port (pdKvPort)" in body["error"]["message"], body
    assert SENTENCE in body["error"]["message"], body


def _short_request(port: int) -> bytes:
    """A request shorter than a KV message's prefix still gets its answer (the kind is read alone first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /\r\n\r\n")
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


async def test_a_request_shorter_than_a_prefix_is_answered_too(prefill_pair: list[Proc]) -> None:
    answer = await asyncio.to_thread(_short_request, prefill_pair[0].kv_port)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer[:200]
    assert SENTENCE.encode() in answer, answer


async def test_the_worker_still_serves_decoders_after_http_clients(prefill_pair: list[Proc]) -> None:
    async with in_process("decode", lanes=2, kv_blocks=4, local_prefill=False,
                          prefill_workers=prefill_pair[0].address) as (_s, url):
        out = await client(url).completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
        assert out.choices[0].finish_reason in ("stop", "length")
