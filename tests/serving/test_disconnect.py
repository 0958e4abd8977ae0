"""A client that disconnects at once (the request and the close in one burst, before the handler's first await
has let its tasks run) cancels its request in every role (standalone, decode, selective decode) and on every
generating route (completions, chat completions, responses), streaming or not: no lane, no KV block, no source
slot and no stream entry is left, and the server goes on serving token-exact."""

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
    scrape,
    wait_metrics,
)
from tests.serving.test_pd import complete_all, decode_settings
from tests.serving.test_pd_selective import selective

pytestmark = pytest.mark.asyncio(loop_scope="session")

MAX_TOKENS = 400  # far more than the test waits for: only a cancel frees these lanes in time
BURST = 6  # more requests than lanes, so some are still queued when their clients leave


async def hit_and_run(url: str, body: dict, path: str = "/v1/completions") -> None:
    """Send one whole request and close the connection in the same write burst, reading nothing."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
    writer.close()
    await writer.wait_closed()


def bodies(stream: bool) -> list[dict]:
    # n=2: two choices per request, each served by its own task in both the plain and the streaming path.
    return [{"model": MODEL, "prompt": f"Gone client {i} asks for a long story", "max_tokens": MAX_TOKENS,
             "n": 2, "temperature": 0, "ignore_eos": True, "stream": stream} for i in range(BURST)]


def chat_bodies(stream: bool) -> list[dict]:
    return [{"model": MODEL, "messages": [{"role": "user", "content": f"Gone client {i} asks for a long story"}],
             "max_tokens": MAX_TOKENS, "n": 2, "temperature": 0, "ignore_eos": True, "stream": stream}
            for i in range(BURST)]


# Responses has neither n nor ignore_eos: one choice per request, and inputs whose greedy output runs to
# max_output_tokens with no EOS, so none can finish by itself before its cancel lands and dodge the count.
RUN_TO_LENGTH = (0, 1, 8, 24, 29, 40)


def responses_bodies(stream: bool) -> list[dict]:
    return [{"model": MODEL, "input": f"Gone client {i} asks for a long story", "max_output_tokens": MAX_TOKENS,
             "temperature": 0, "stream": stream} for i in RUN_TO_LENGTH]


# route: (path, the gone clients' bodies, the choices each request queues)
ROUTES = {"completions": ("/v1/completions", bodies, 2), "chat": ("/v1/chat/completions", chat_bodies, 2),
          "responses": ("/v1/responses", responses_bodies, 1)}
with_every_route = pytest.mark.parametrize("route", list(ROUTES))


async def leave_at_once(url: str, route: str, stream: bool) -> int:
    """Every gone client of ``route`` at once; the number of choices they queued."""
    path, make, per_request = ROUTES[route]
    sent = make(stream)
    await asyncio.gather(*(hit_and_run(url, b, path) for b in sent))
    return per_request * len(sent)


async def check_everything_freed(server, url: str, choices: int = 2 * BURST) -> None:  # noqa: ANN001
    m = await wait_metrics(url, lambda m: idle(m) and m["atom:requests_cancelled_total"] == choices,
                           "every choice of the gone clients to be cancelled", timeout=60)
    assert_no_block_leaked(m)
    assert m["vllm:generation_tokens_total"] < choices * MAX_TOKENS
    assert server.aengine.streams == {}
    prompts = ["After the storm", "a live client"]
    assert await complete_all(url, prompts) == reference_tokens(prompts, 12)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streaming"])
@with_every_route
async def test_an_immediate_disconnect_frees_everything_standalone(route: str, stream: bool) -> None:
    async with in_process("standalone", lanes=2, kv_blocks=3, prefix_cache=False) as (server, url):
        choices = await leave_at_once(url, route, stream)
        await check_everything_freed(server, url, choices)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streaming"])
@with_every_route
async def test_an_immediate_disconnect_frees_everything_decode(prefill_pair: list[Proc], route: str,
                                                               stream: bool) -> None:
    async with in_process("decode", **decode_settings(prefill_pair[:1], False)) as (server, url):
        choices = await leave_at_once(url, route, stream)
        await check_everything_freed(server, url, choices)


SELECTIVE_THRESHOLD = 8  # tokens: below every prompt here, the gone clients' and the live ones', so all go remote


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streaming"])
@with_every_route
async def test_an_immediate_disconnect_frees_everything_selective_decode(prefill_pair: list[Proc], route: str,
                                                                         stream: bool) -> None:
    settings = {**selective(prefill_pair[0].address), "remote_prefill_min_tokens": SELECTIVE_THRESHOLD}
    async with in_process("decode", **settings) as (server, url):
        choices = await leave_at_once(url, route, stream)
        await check_everything_freed(server, url, choices)
        # The live prompts went to the worker: the remote path of a pod that may prefill is the one under test.
        m = await scrape(url)
        assert m["atom:pd_remote_prefills_total"] >= 2 and m["atom:pd_local_prefills_total"] == 0
