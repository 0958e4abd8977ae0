"""Inputs the model cannot take are refused with a 400 naming them, never dropped: media content parts on a text
model, fields that would change the answer; fields that cannot change it are accepted (as vLLM does). And the
chat message carries OpenAI's required ``refusal`` and ``annotations``."""

from __future__ import annotations

import aiohttp
import pytest
import pytest_asyncio

from tests.serving.conftest import MODEL, client, in_process

pytestmark = pytest.mark.asyncio(loop_scope="session")
HI = [{"role": "user", "content": "Hi"}]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tiny():  # noqa: ANN201
    async with in_process("standalone", lanes=2, kv_blocks=4, prefix_cache=True) as (_server, url):
        yield url


async def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}{path}", json=body) as r:
        return r.status, await r.json()


def assert_openai_400(status: int, body: dict, param: str, needle: str) -> None:
    assert status == 400, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert needle in err["message"], err


async def test_chat_message_has_refusal_and_annotations(tiny: str) -> None:
    status, body = await post(tiny, "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 2})
    assert status == 200
    message = body["choices"][0]["message"]
    assert message["refusal"] is None and message["annotations"] == []
    out = await client(tiny).chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
    assert out.choices[0].message.refusal is None


@pytest.mark.parametrize(("part", "needle"), [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "needs a model that takes images"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "needs a model that takes audio"),
    ({"type": "file", "file": {"file_data": "AAAA", "filename": "a.pdf"}}, "needs a model that takes files"),
    ({"type": "hologram"}, "unknown content part type 'hologram'"),
    ({"type": "text"}, "a 'text' part needs a string 'text'"),
])
async def test_content_parts_the_model_cannot_take_are_refused_naming_the_part(tiny: str, part: dict,
                                                                              needle: str) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    status, body = await post(tiny, "/v1/chat/completions", {"model": MODEL, "messages": messages})
    assert_openai_400(status, body, "messages", needle)
    assert "messages[1].content[1]" in body["error"]["message"]
    status, body = await post(tiny, "/tokenize", {"messages": messages})
    assert_openai_400(status, body, "messages", needle)


async def test_text_parts_are_the_message_text(tiny: str) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "H"}, {"type": "text", "text": "i"}]}]
    _, joined = await post(tiny, "/tokenize", {"messages": parts})
    _, plain = await post(tiny, "/tokenize", {"messages": HI})
    assert joined["tokens"] == plain["tokens"]


@pytest.mark.parametrize(("field", "value"), [
    ("best_of", 3), ("min_p", 0.1), ("use_beam_search", True), ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}), ("functions", [{"name": "f"}]), ("reasoning_effort", "high"),
    ("chat_template", "{{ messages }}"), ("add_generation_prompt", False), ("skip_special_tokens", False),
])
async def test_fields_that_would_change_the_answer_are_refused(tiny: str, field: str, value: object) -> None:
    status, body = await post(tiny, "/v1/chat/completions", {"model": MODEL, "messages": HI, field: value})
    assert_openai_400(status, body, field, "not supported by this engine")


async def test_an_assistant_message_with_audio_is_refused(tiny: str) -> None:
    messages = [*HI, {"role": "assistant", "content": None, "audio": {"id": "a1"}}, *HI]
    status, body = await post(tiny, "/v1/chat/completions", {"model": MODEL, "messages": messages})
    assert_openai_400(status, body, "audio", "not supported")


async def test_neutral_values_and_harmless_fields_are_accepted_and_change_nothing(tiny: str) -> None:
    base = {"model": MODEL, "messages": HI, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    _, plain = await post(tiny, "/v1/chat/completions", base)
    extras = {"best_of": 1, "min_p": 0.0, "modalities": ["text"], "skip_special_tokens": True, "store": False,
              "metadata": {"team": "a"}, "service_tier": "auto", "parallel_tool_calls": True,
              "some_vendor_extra": {"x": 1}}
    status, body = await post(tiny, "/v1/chat/completions", {**base, **extras})
    assert status == 200, body
    assert body["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    status, body = await post(tiny, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1,
                                                        "best_of": 2})
    assert_openai_400(status, body, "best_of", "not supported")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_body_without_model_is_a_400(tiny: str, path: str) -> None:
    status, body = await post(tiny, path, {"prompt": "x", "messages": HI})
    assert_openai_400(status, body, "model", "Field required")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize"])
async def test_a_body_nested_deeper_than_the_parser_goes_is_a_400_not_a_500(tiny: str, path: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    body = f'{{"model": "{MODEL}", "prompt": "x", "input": "x", "messages": {deep}}}'
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s, s.post(f"{tiny}{path}", data=body, headers=headers) as r:
        status, got = r.status, await r.json()
    assert status == 400, got
    err = got["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_json", err
    assert "too deep" in err["message"], err
