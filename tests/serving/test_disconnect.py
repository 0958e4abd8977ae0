"""A client that disconnects at once (the request and the close in one burst, before the handler's first await
has let its tasks run) cancels its request in every role, streaming or not: no lane, no KV block, no source slot
and no stream entry is left, and the server goes on serving token-exact."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.serving.conftest import (
    MODEL,
    Proc,
    assert_no_block_leaked,
    idle,
    in_process,
    reference_tokens,
    wait_metrics,
)
from tests.serving.test_pd import complete_all, decode_settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

MAX_TOKENS = 400  # far more than the test waits for: only a cancel frees these lanes in time
BURST = 6  # more requests than lanes, so some are still queued when their clients leave


async def hit_and_run(url: str, body: dict) -> None:
    """Send one whole request and close the connection in the same write burst, reading nothing."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    writer.close()
    await writer.wait_closed()


def bodies(stream: bool) -> list[dict]:
    # n=2: two choices per request, each served by its own task in both the plain and the streaming path.
    return [{"model": MODEL, "prompt": f"Gone client {i} asks for a long story", "max_tokens": MAX_TOKENS,
             "n": 2, "temperature": 0, "ignore_eos": True, "stream": stream} for i in range(BURST)]


async def check_everything_freed(server, url: str) -> None:  # noqa: ANN001
    m = await wait_metrics(url, lambda m: idle(m) and m["atom:requests_cancelled_total"] == 2 * BURST,
                           "every choice of the gone clients to be cancelled", timeout=60)
    assert_no_block_leaked(m)
    assert m["vllm:generation_tokens_total"] < 2 * BURST * MAX_TOKENS
    assert server.aengine.streams == {}
    prompts = ["After the storm", "a live client"]
    assert await complete_all(url, prompts) == reference_tokens(prompts, 12)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streaming"])
async def test_an_immediate_disconnect_frees_everything_standalone(stream: bool) -> None:
    async with in_process("standalone", lanes=2, kv_blocks=3, prefix_cache=False) as (server, url):
        await asyncio.gather(*(hit_and_run(url, b) for b in bodies(stream)))
        await check_everything_freed(server, url)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streaming"])
async def test_an_immediate_disconnect_frees_everything_decode(prefill_pair: list[Proc], stream: bool) -> None:
    async with in_process("decode", **decode_settings(prefill_pair[:1], False)) as (server, url):
        await asyncio.gather(*(hit_and_run(url, b) for b in bodies(stream)))
        await check_everything_freed(server, url)
