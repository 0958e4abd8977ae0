"""The OpenAI surface of a standalone server, through the real ``openai`` client: routes, streaming, errors with
their status codes and bodies, the bounded queue, disconnects, probes and metric names."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import openai
import pytest
import pytest_asyncio

from tests.serving.conftest import (
    MODEL,
    assert_no_block_leaked,
    client,
    idle,
    in_process,
    reference_tokens,
    scrape,
    wait_metrics,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
PROMPT = "The quick brown fox"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def _standalone():  # noqa: ANN202
    async with in_process("standalone", lanes=2, kv_blocks=4, prefix_cache=True) as (_server, url):
        yield url


async def test_completion_returns_text_tokens_and_usage(_standalone: str) -> None:
    out = await client(_standalone).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"return_token_ids": True,
                                                                              "ignore_eos": True})
    choice = out.choices[0]
    assert choice.token_ids == reference_tokens([PROMPT], 8)[0]
    assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(PROMPT.encode()) and out.usage.completion_tokens == 8
    assert out.model == MODEL and out.object == "text_completion"


async def test_streamed_completion_equals_the_plain_one_and_ends_with_done(_standalone: str) -> None:
    c = client(_standalone)
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True,
                                                                                      "return_token_ids": True})
    whole = await c.completions.create(**args)
    chunks = [ch async for ch in await c.completions.create(**args, stream=True,
                                                            stream_options={"include_usage": True})]
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    assert [t for ch in chunks if ch.choices for t in ch.choices[0].token_ids] == whole.choices[0].token_ids
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 12  # the usage chunk comes last, with no choices
    # The raw stream ends with the [DONE] sentinel.
    async with aiohttp.ClientSession() as s, s.post(f"{_standalone}/v1/completions",
                                                    json={**args, "stream": True, **args["extra_body"]}) as r:
        body = await r.text()
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert body.rstrip().endswith("data: [DONE]")


async def test_chat_plain_and_streamed_agree(_standalone: str) -> None:
    c = client(_standalone)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    args = dict(model=MODEL, messages=messages, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    whole = await c.chat.completions.create(**args)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    chunks = [ch async for ch in await c.chat.completions.create(**args, stream=True)]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10


async def test_models_lists_the_served_model(_standalone: str) -> None:
    models = await client(_standalone).models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_stop_string_cuts_the_output(_standalone: str) -> None:
    c = client(_standalone)
    full = (await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0,
                                       extra_body={"ignore_eos": True})).choices[0].text
    stop = next(ch for ch in full[3:] if ch.isprintable() and ch != "\ufffd")
    cut = await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop],
                                     extra_body={"ignore_eos": True})
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = [ch async for ch in await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20,
                                                              temperature=0, stop=[stop], stream=True,
                                                              extra_body={"ignore_eos": True})]
    assert "".join(ch.choices[0].text for ch in streamed) == cut.choices[0].text


async def test_seeded_sampling_is_reproducible(_standalone: str) -> None:
    c = client(_standalone)
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0.9, top_p=0.9, seed=7,
                extra_body={"top_k": 50, "return_token_ids": True, "ignore_eos": True})
    a, b = await asyncio.gather(c.completions.create(**args), c.completions.create(**args))
    assert a.choices[0].token_ids == b.choices[0].token_ids


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"model": MODEL, "prompt": "x", "max_tokens": "5"}, "max_tokens", "valid integer"),
        ({"model": MODEL, "prompt": 5}, "prompt", ""),
        ({"model": MODEL, "prompt": "x", "temperature": 3.0}, "temperature", "less than or equal to 2"),
        ({"model": MODEL, "prompt": "x", "top_p": 0}, "top_p", "greater than 0"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens", "0 only with echo=true"),
        ({"model": MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens", "greater than or equal to 0"),
        ({"model": MODEL, "prompt": "x", "n": 0}, "n", "greater than or equal to 1"),
        ({"model": MODEL, "prompt": "x", "n": 129}, "n", "less than or equal to 128"),
        ({"model": MODEL, "prompt": "x", "logprobs": 21}, "logprobs", "less than or equal to 20"),
        ({"model": MODEL, "prompt": "x", "logprobs": -1}, "logprobs", "greater than or equal to 0"),
        ({"model": MODEL, "prompt": "x", "logprobs": True}, "logprobs", "valid integer"),
        ({"model": MODEL, "prompt": "x", "echo": "yes"}, "echo", "valid boolean"),
        ({"model": MODEL, "prompt": "x", "min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens", "<= max_tokens (4)"),
        ({"model": MODEL, "prompt": "x", "min_tokens": 17}, "min_tokens", "min_tokens must be in [0, max_tokens=16]"),
        ({"model": MODEL, "prompt": "x", "repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
        ({"model": MODEL, "prompt": "x", "repetition_penalty": 2.5}, "repetition_penalty", "less than or equal to 2"),
        ({"model": MODEL, "prompt": "x", "presence_penalty": -2.1}, "presence_penalty", "greater than or equal to -2"),
        ({"model": MODEL, "prompt": "x", "frequency_penalty": 2.1}, "frequency_penalty", "less than or equal to 2"),
        ({"model": MODEL, "prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids", "must be >= 0"),
        ({"model": MODEL, "prompt": "x", "stop_token_ids": ["a"]}, "stop_token_ids", "valid integer"),
        ({"model": MODEL, "prompt": "x", "ignore_eos": 1}, "ignore_eos", "valid boolean"),
        ({"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options",
         "only allowed with stream=true"),
        ({"model": MODEL, "prompt": "x", "stream": True, "stream_options": {"include_usage": "y"}}, "stream_options",
         "valid boolean"),
        ({"model": MODEL, "prompt": "x", "stream": True, "prompt_logprobs": 1}, "prompt_logprobs",
         "not available with stream=true"),
        ({"model": MODEL, "prompt": []}, "prompt", "the prompt is empty"),
        ({"model": MODEL, "prompt": [[1], []]}, "prompt", "the prompt is empty"),
        ({"model": MODEL, "prompt": [[1], [999]]}, "prompt", "token ids must be in [0, 320)"),
        ({"model": MODEL, "prompt": [1, "a"]}, "prompt", ""),
        ({"model": MODEL, "prompt": "x", "logit_bias": {"5": 101}}, "logit_bias", "values in [-100, 100]"),
        ({"model": MODEL, "prompt": "x", "logit_bias": {"a": 1}}, "logit_bias", "keys must be token ids"),
        ({"model": MODEL, "prompt": "x", "logit_bias": {"320": 1}}, "logit_bias", "token ids must be < 320"),
        ({"model": MODEL, "prompt": "x", "suffix": "y"}, "suffix", "not supported"),
        ({"model": MODEL, "prompt": "x", "response_format": {"type": "xml"}}, "response_format",
         "one of 'text', 'json_object', 'json_schema'"),
        ({"model": MODEL, "prompt": [999]}, "prompt", "token ids must be in [0, 320)"),
        ({"model": MODEL, "prompt": ""}, "prompt", "the prompt is empty"),
        ({"prompt": "x"}, "model", "Field required"),
    ],
)
async def test_bad_requests_get_400_with_an_openai_error_body(_standalone: str, body: dict, param: str,
                                                             needle: str) -> None:
    async with aiohttp.ClientSession() as s, s.post(f"{_standalone}/v1/completions", json=body) as r:
        err = (await r.json())["error"]
    assert r.status == 400, err
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param and needle in err["message"]


async def test_malformed_json_gets_400(_standalone: str) -> None:
    async with aiohttp.ClientSession() as s, s.post(f"{_standalone}/v1/chat/completions", data=b"{not json",
                                                    headers={"Content-Type": "application/json"}) as r:
        err = (await r.json())["error"]
    assert r.status == 400 and err["code"] == "invalid_json"


async def test_prompt_that_cannot_fit_gets_400_naming_the_lengths(_standalone: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client(_standalone).completions.create(model=MODEL, prompt="a" * 500, max_tokens=20)
    err = info.value.body
    assert info.value.status_code == 400 and err["code"] == "context_length_exceeded"
    assert "maximum context length is 512 tokens; the prompt has 500 tokens and max_tokens is 20" in err["message"]


async def test_unknown_route_gets_404_json(_standalone: str) -> None:
    async with aiohttp.ClientSession() as s, s.get(f"{_standalone}/v1/nothing") as r:
        body = await r.json()
    assert r.status == 404 and body["error"]["type"] == "not_found_error"


async def test_probes_and_vllm_metric_names(_standalone: str) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ("/health", "/ready"):
            async with s.get(f"{_standalone}{path}") as r:
                assert r.status == 200, path
        async with s.get(f"{_standalone}/metrics") as r:
            text = await r.text()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                 "atom:kv_blocks_free", "atom:kv_blocks_cached", "atom:kv_blocks_lanes"):
        assert re.search(rf'^{name}{{[^}}]*model_name="{MODEL}"', text, re.M), name


async def test_cache_config_info_gives_routers_the_kv_capacity_in_16_token_blocks(_standalone: str) -> None:
    """What the Gateway API Inference Extension's endpoint picker reads to size its prefix index (vLLM's labels)."""
    async with aiohttp.ClientSession() as s, s.get(f"{_standalone}/metrics") as r:
        text = await r.text()
    info = re.search(r"^vllm:cache_config_info{(.*)} 1\.0$", text, re.M)
    assert info, text
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
    # kvBlocks=4 with the default maxSeqLen 512: 3 blocks (the scratch block excluded) of 512 tokens = 96 x 16
    assert labels["block_size"] == "16" and labels["num_gpu_blocks"] == "96"
    assert labels["enable_prefix_caching"] == "True"


async def test_disconnect_cancels_the_request_and_frees_its_lane_and_block(_standalone: str) -> None:
    before = await wait_metrics(_standalone, idle, "an idle engine")
    stream = await client(_standalone).completions.create(model=MODEL, prompt=PROMPT, max_tokens=400,
                                                          temperature=0, stream=True,
                                                          extra_body={"ignore_eos": True})
    async for _chunk in stream:
        break  # one token arrived: the request holds a lane
    await stream.close()
    m = await wait_metrics(_standalone, lambda m: m["atom:requests_cancelled_total"]
                           == before["atom:requests_cancelled_total"] + 1 and idle(m), "the cancel")
    assert m["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 400
    assert_no_block_leaked(m)


async def test_full_queue_gets_429() -> None:
    async with in_process("standalone", lanes=1, kv_blocks=2, prefix_cache=False, max_waiting=1) as (_s, url):
        c = client(url)
        running = await c.completions.create(model=MODEL, prompt="a", max_tokens=400, temperature=0, stream=True,
                                             extra_body={"ignore_eos": True})
        async for _chunk in running:
            break
        waiting = asyncio.create_task(c.completions.create(model=MODEL, prompt="b", max_tokens=4))
        await wait_metrics(url, lambda m: m["vllm:num_requests_waiting"] == 1, "one waiting request")
        with pytest.raises(openai.RateLimitError) as info:
            await c.completions.create(model=MODEL, prompt="c", max_tokens=4)
        assert info.value.status_code == 429 and info.value.body["code"] == "queue_full"
        assert "maxWaiting=1" in info.value.body["message"]
        await running.close()
        assert (await asyncio.wait_for(waiting, 60)).choices[0].finish_reason in ("length", "stop")
        assert_no_block_leaked(await wait_metrics(url, idle, "idle"))


async def test_dead_engine_loop_turns_health_and_requests_into_503() -> None:
    async with in_process("standalone", lanes=1, kv_blocks=2, prefix_cache=False) as (server, url):
        def broken_step() -> list:
            raise RuntimeError("injected engine bug")

        server.engine.step = broken_step
        with pytest.raises(openai.APIStatusError) as info:
            await client(url).completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert info.value.status_code == 503 and "injected engine bug" in info.value.body["message"]
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/health") as r:
                assert r.status == 503 and "injected engine bug" in json.dumps(await r.json())
            async with s.get(f"{url}/ready") as r:
                assert r.status == 503
        with pytest.raises(openai.APIStatusError) as info:
            await client(url).completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert info.value.status_code == 503 and info.value.body["code"] == "engine_dead"


async def test_metrics_count_tokens(_standalone: str) -> None:
    before = await scrape(_standalone)
    await client(_standalone).completions.create(model=MODEL, prompt="count me", max_tokens=3, temperature=0,
                                                 extra_body={"ignore_eos": True})
    after = await scrape(_standalone)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 3
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == len(b"count me")
    assert after["vllm:e2e_request_latency_seconds_count"] == before["vllm:e2e_request_latency_seconds_count"] + 1
