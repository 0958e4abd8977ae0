"""The Responses API (``POST /v1/responses``) through the ``openai`` client's ``client.responses.create``, whole
and streamed (its typed events, parsed by the client): text, ``instructions``, ``max_output_tokens``,
``text.format`` structured output, function tools, ``previous_response_id`` where the response was kept and a
400 where it was not, and errors in OpenAI's body."""

from __future__ import annotations

import json

import aiohttp
import jsonschema
import openai
import pytest
import pytest_asyncio

from tests.serving.conftest import MODEL, assert_no_block_leaked, client, idle, in_process, scrape, wait_metrics
from tests.serving.test_tools import (  # noqa: F401 (fixtures)
    ORPHAN_RESULT,
    SCHEMAS,
    TOOLS,
    hermes,
    hermes_path,
    post,
    strict,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]  # the Responses API's tool shape
POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "tag": {"type": "string", "maxLength": 5}}, "required": ["x", "tag"]}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tiny():  # noqa: ANN201
    async with in_process("standalone", lanes=2, kv_blocks=4, prefix_cache=True) as (_server, url):
        yield url


async def events_of(stream) -> list:  # noqa: ANN001
    return [event async for event in stream]


async def test_text_round_trip_equals_the_chat_route(tiny: str) -> None:
    c = client(tiny)
    resp = await c.responses.create(model=MODEL, input="Hello there", instructions="Be brief.", max_output_tokens=6,
                                    temperature=0, store=False)
    chat = await c.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "Be brief."},
                                                                  {"role": "user", "content": "Hello there"}],
                                           max_tokens=6, temperature=0)
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.model == MODEL
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage.input_tokens == chat.usage.prompt_tokens and resp.usage.output_tokens == 6
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    (item,) = resp.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"


async def test_the_chat_routes_sampling_extensions_sample_as_the_same_chat_request(tiny: str) -> None:
    """seed, logit_bias and the penalties are not OpenAI Responses fields; agent frameworks send them as extra
    body fields (openai-agents' extra_body) and they must act as on the chat route, not be ignored."""
    c = client(tiny)
    extra = {"seed": 11, "logit_bias": {"7": 5.0}, "repetition_penalty": 1.2}
    resp = await c.responses.create(model=MODEL, input="Hello there", max_output_tokens=8, temperature=1.0,
                                    store=False, extra_body=extra)
    chat = await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello there"}],
                                           max_tokens=8, temperature=1.0, extra_body=extra)
    unseeded = {k: v for k, v in extra.items() if k != "seed"}
    others = {(await c.responses.create(model=MODEL, input="Hello there", max_output_tokens=8, temperature=1.0,
                                        store=False, extra_body={**unseeded, "seed": seed})).output_text
              for seed in (12, 13, 14)}
    assert resp.output_text == chat.choices[0].message.content and others != {resp.output_text}
    status, out = await post(tiny, "/v1/responses", {"model": MODEL, "input": "Hi", "logit_bias": {"7": 500}})
    assert status == 400 and "logit_bias" in out["error"]["message"], out


async def test_streamed_events_are_typed_numbered_and_add_up_to_the_whole(tiny: str) -> None:
    c = client(tiny)
    args = dict(model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
                max_output_tokens=8, temperature=0, store=False)
    whole = await c.responses.create(**args)
    events = await events_of(await c.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert events[-4].text == text  # output_text.done carries the whole text


async def test_text_format_json_schema_constrains_the_output(tiny: str) -> None:
    fmt = {"type": "json_schema", "name": "point", "schema": POINT, "strict": True}
    for stream in (False, True):
        args = dict(model=MODEL, input="A point", text={"format": fmt}, temperature=1.0, max_output_tokens=200,
                    store=False)
        if stream:
            events = await events_of(await client(tiny).responses.create(**args, stream=True))
            resp = events[-1].response
        else:
            resp = await client(tiny).responses.create(**args)
        assert resp.status == "completed"
        jsonschema.validate(json.loads(resp.output_text), POINT)


async def test_previous_response_id_continues_a_kept_response(tiny: str) -> None:
    c = client(tiny)
    first = await c.responses.create(model=MODEL, input="One", max_output_tokens=4, temperature=0)
    second = await c.responses.create(model=MODEL, input="Two", max_output_tokens=4, temperature=0,
                                      previous_response_id=first.id)
    # the second prompt holds the first turn (its input and output) before the new input
    fresh = await c.responses.create(model=MODEL, input="Two", max_output_tokens=4, temperature=0, store=False)
    assert second.usage.input_tokens > fresh.usage.input_tokens + first.usage.output_tokens
    assert second.previous_response_id == first.id
    kept = await c.responses.retrieve(first.id)
    assert kept.id == first.id and kept.output_text == first.output_text


async def test_previous_response_id_is_a_400_where_nothing_was_kept(tiny: str) -> None:
    c = client(tiny)
    unkept = await c.responses.create(model=MODEL, input="One", max_output_tokens=2, store=False)
    for rid in (unkept.id, "resp_nope"):
        with pytest.raises(openai.BadRequestError) as info:
            await c.responses.create(model=MODEL, input="Two", previous_response_id=rid)
        err = info.value.body
        assert err["param"] == "previous_response_id" and "not kept here" in err["message"]
    with pytest.raises(openai.NotFoundError):
        await c.responses.retrieve(unkept.id)


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"input": "x"}, "model", "Field required"),
    ({"model": MODEL}, "input", "Field required"),
    ({"model": MODEL, "input": [{"type": "reasoning", "summary": []}]}, "input", "'reasoning' items"),
    ({"model": MODEL, "instructions": "Be brief.", "input": [
        {"role": "user", "content": "Look"},
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]},
     "input", "input[1].content[0]: a 'input_image' content part needs a model that takes images"),
    ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}, "tools", "only function tools"),
    ({"model": MODEL, "input": "x", "tools": FLAT_TOOLS}, "tools", "does not render tools"),
    ({"model": MODEL, "input": "x", "text": {"format": {"type": "yaml"}}}, "text", "text.format.type"),
    ({"model": MODEL, "input": "x", "max_output_tokens": 0}, "max_output_tokens", "greater than or equal to 1"),
    ({"model": MODEL, "input": "x", "truncation": "auto"}, "truncation", ""),
    ({"model": MODEL, "input": "x", "background": True}, "background", "not supported"),
    ({"model": MODEL, "input": "x", "reasoning": {"effort": "high"}}, "reasoning", "does not reason"),
])
async def test_bad_requests_are_400_in_openai_shape(tiny: str, body: dict, param: str, needle: str) -> None:
    status, out = await post(tiny, "/v1/responses", body)
    assert status == 400, out
    err = out["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and needle in err["message"], err
    assert_no_block_leaked(await wait_metrics(tiny, idle, "idle"))


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("conversation", "conv_123", "keeps no conversations"),
    ("conversation", {"id": "conv_123"}, "keeps no conversations"),
    ("prompt", {"id": "pmpt_123", "variables": {"city": "Paris"}}, "keeps no prompt templates"),
])
async def test_input_kept_on_openais_side_is_refused_naming_the_field(tiny: str, field: str, value: object,
                                                                      needle: str) -> None:
    status, out = await post(tiny, "/v1/responses", {"model": MODEL, "input": "x", field: value})
    assert status == 400, out
    err = out["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field and needle in err["message"], err


async def test_conversation_and_prompt_left_null_are_served(tiny: str) -> None:
    status, out = await post(tiny, "/v1/responses", {"model": MODEL, "input": "x", "max_output_tokens": 1,
                                                     "store": False, "conversation": None, "prompt": None})
    assert status == 200, out


async def test_function_tools_called_whole_and_streamed_then_answered(hermes: str) -> None:  # noqa: F811
    c = client(hermes)
    args = dict(model=MODEL, input="Weather in Paris?", tools=FLAT_TOOLS, tool_choice="required",
                parallel_tool_calls=False, temperature=1.0, max_output_tokens=250)
    resp = await c.responses.create(**args)
    (call,) = [o for o in resp.output if o.type == "function_call"]
    assert resp.status == "completed" and call.call_id.startswith("call_") and call.name in SCHEMAS
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    named = {**args, "tool_choice": {"type": "function", "name": "get_time"}}
    events = await events_of(await c.responses.create(**named, stream=True))
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds
    # the call's arguments stream in pieces between its item's added and done events
    deltas = kinds.count("response.function_call_arguments.delta")
    assert deltas >= 2 and kinds[2:5 + deltas] == ["response.output_item.added", *[
        "response.function_call_arguments.delta"] * deltas, "response.function_call_arguments.done",
        "response.output_item.done"]
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(pieces) == events[-1].response.output[0].arguments
    done = events[-1].response.output[0]
    assert done.type == "function_call" and done.name == "get_time"
    jsonschema.validate(json.loads(done.arguments), SCHEMAS["get_time"])
    # the call's output goes back as an input item after the kept response
    follow = await c.responses.create(model=MODEL, previous_response_id=resp.id, tools=FLAT_TOOLS,
                                      input=[{"type": "function_call_output", "call_id": call.call_id,
                                              "output": "21 degrees"}], max_output_tokens=3, temperature=0)
    assert follow.usage.input_tokens > resp.usage.input_tokens + resp.usage.output_tokens


async def test_a_client_leaving_mid_stream_frees_its_lane_and_block(tiny: str) -> None:
    body = {"model": MODEL, "input": "Tell me a long story", "max_output_tokens": 400, "stream": True,
            "store": False}
    before = await scrape(tiny)
    async with aiohttp.ClientSession() as s, s.post(f"{tiny}/v1/responses", json=body) as r:
        assert r.status == 200
        first = await r.content.readline()
        assert first.startswith(b"event: response.created")
    m = await wait_metrics(tiny, lambda m: m["atom:requests_cancelled_total"]
                           == before["atom:requests_cancelled_total"] + 1 and idle(m), "the cancel")
    assert_no_block_leaked(m)


async def test_an_input_the_template_refuses_is_a_400_naming_input(strict: str) -> None:  # noqa: F811
    orphan = [{"role": "user", "content": "Weather in Paris?"},
              {"type": "function_call_output", "call_id": "call_1", "output": "21 degrees"}]
    status, out = await post(strict, "/v1/responses", {"model": MODEL, "input": orphan, "tools": FLAT_TOOLS})
    assert status == 400, out
    err = out["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "input", err
    assert err["message"].startswith("input: ") and ORPHAN_RESULT in err["message"], err
