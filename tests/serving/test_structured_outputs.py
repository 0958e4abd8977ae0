"""Structured outputs: ``response_format`` (``json_schema``, ``json_object``) and vLLM's ``structured_outputs`` /
``guided_*`` through xgrammar, applied as a token mask at sampling. Every sample of ``n`` at temperature 1
validates (jsonschema) on the trained model and on random weights, streamed or not, after a prefix-cache hit,
and through PD (the first token, sampled from the prefill worker's logits, obeys the grammar too)."""

from __future__ import annotations

import json
import re

import aiohttp
import jsonschema
import pytest
import pytest_asyncio
from atom_engine.structured.compiler import MAX_SCHEMA_DEPTH

from tests.serving.conftest import MODEL, Proc, assert_no_block_leaked, client, idle, in_process, wait_metrics
from tests.serving.test_pd import decode_settings

pytestmark = pytest.mark.asyncio(loop_scope="session")
SMOL = "smollm2"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
# The suite: objects, arrays, enums, nested objects, $ref. Strings and numbers are bounded so that random weights
# (which never choose to close a string) still end within max_tokens.
SCHEMAS = {
    "object": PERSON,
    "array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1,
              "maxItems": 4},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                              "sure": {"type": "boolean"}}, "required": ["color", "sure"]},
    "nested": {"type": "object", "properties": {
        "user": PERSON, "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
        "required": ["user", "tags"]},
    "ref": {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9,
                                                                       "maximum": 9},
                                                                 "y": {"type": "integer", "minimum": -9,
                                                                       "maximum": 9}},
                                "required": ["x", "y"]}},
            "type": "object", "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
            "required": ["start", "end"]},
}
ASK = [{"role": "user", "content": "Reply with JSON only: a person named Ada who is 36."}]
REGEX = r"(0|[1-9][0-9]?)\.[0-9]"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def smol():  # noqa: ANN201
    async with in_process("standalone", model_name=SMOL, model_source="builtin:smollm2-135m", lanes=4, kv_blocks=8,
                          prefix_cache=True, max_seq_len=512, prefill_chunk=64) as (server, url):
        yield server, url


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tiny():  # noqa: ANN201
    async with in_process("standalone", lanes=4, kv_blocks=6, prefix_cache=True) as (server, url):
        yield server, url


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


async def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}{path}", json=body) as r:
        return r.status, await r.json()


async def streamed_texts(url: str, body: dict) -> dict[int, str]:
    texts: dict[int, str] = {}
    stream = await client(url).chat.completions.create(**body, stream=True)
    async for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
    return texts


@pytest.mark.parametrize("case", sorted(SCHEMAS))
async def test_every_sample_of_n_at_temperature_1_validates_on_the_trained_model(smol: tuple, case: str) -> None:
    _, url = smol
    out = await client(url).chat.completions.create(model=SMOL, messages=ASK, n=4, temperature=1.0, seed=7,
                                                    max_tokens=200, response_format=response_format(SCHEMAS[case]))
    assert len(out.choices) == 4
    for ch in out.choices:
        assert ch.finish_reason == "stop", ch.message.content
        jsonschema.validate(json.loads(ch.message.content), SCHEMAS[case])


@pytest.mark.parametrize("case", sorted(SCHEMAS))
async def test_every_sample_validates_on_random_weights_streamed_and_not(tiny: tuple, case: str) -> None:
    _, url = tiny
    body = dict(model=MODEL, messages=ASK, n=4, temperature=1.0, seed=3, max_tokens=300,
                response_format=response_format(SCHEMAS[case]))
    whole = await client(url).chat.completions.create(**body)
    texts = await streamed_texts(url, body)
    assert [texts[i] for i in range(4)] == [ch.message.content for ch in whole.choices]  # seeded: the same
    for ch in whole.choices:
        assert ch.finish_reason == "stop", ch.message.content
        jsonschema.validate(json.loads(ch.message.content), SCHEMAS[case])


async def test_the_mask_is_what_makes_it_valid(tiny: tuple) -> None:
    """Negative control: the same seeded request without the schema is not JSON."""
    _, url = tiny
    body = dict(model=MODEL, messages=ASK, temperature=1.0, seed=3, max_tokens=40)
    free = await client(url).chat.completions.create(**body)
    with pytest.raises(ValueError):
        json.loads(free.choices[0].message.content)


async def test_json_object_gives_an_object(smol: tuple) -> None:
    # (at temperature 1 this 135M model may ramble past max_tokens inside an unconstrained object)
    _, url = smol
    out = await client(url).chat.completions.create(model=SMOL, messages=ASK, n=2, temperature=0.5, seed=1,
                                                    max_tokens=200, response_format={"type": "json_object"})
    for ch in out.choices:
        assert ch.finish_reason == "stop" and isinstance(json.loads(ch.message.content), dict)


@pytest.mark.parametrize(("extra", "check"), [
    ({"guided_choice": ["alpha", "beta", "gamma"]}, lambda t: t in {"alpha", "beta", "gamma"}),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in {"yes", "no"}),
    ({"guided_regex": r"[A-Z][0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"[A-Z][0-9]{3}-[a-z]{2}", t)),
    ({"structured_outputs": {"regex": REGEX}}, lambda t: re.fullmatch(REGEX, t)),
    ({"guided_grammar": 'root ::= "x" ("+" "x"){0,3}'}, lambda t: re.fullmatch(r"x(\+x){0,3}", t)),
    ({"structured_outputs": {"json": SCHEMAS["array"]}}, lambda t: jsonschema.validate(json.loads(t),
                                                                                      SCHEMAS["array"]) is None),
    ({"guided_json": json.dumps(SCHEMAS["enum"])}, lambda t: jsonschema.validate(json.loads(t),
                                                                                SCHEMAS["enum"]) is None),
])
async def test_vllm_extras_constrain_chat_and_completions(tiny: tuple, extra: dict, check) -> None:  # noqa: ANN001
    _, url = tiny
    for path, body in (("/v1/chat/completions", {"messages": ASK}), ("/v1/completions", {"prompt": "Answer:"})):
        status, out = await post(url, path, {"model": MODEL, **body, "n": 3, "temperature": 1.0, "seed": 5,
                                             "max_tokens": 200, **extra})
        assert status == 200, out
        for ch in out["choices"]:
            text = ch["message"]["content"] if "message" in ch else ch["text"]
            assert ch["finish_reason"] == "stop" and check(text), text


async def test_a_prefix_cache_hit_and_greedy_decoding_keep_the_grammar(tiny: tuple) -> None:
    server, url = tiny
    body = {"model": MODEL, "messages": ASK, "temperature": 0, "max_tokens": 200,
            "response_format": response_format(SCHEMAS["nested"])}
    _, first = await post(url, "/v1/chat/completions", body)
    _, again = await post(url, "/v1/chat/completions", body)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(again["choices"][0]["message"]["content"]), SCHEMAS["nested"])
    # compiled once: the same schema again is a cache hit
    grammars = server.routes.structured._grammars
    compiled = grammars.compiled
    await post(url, "/v1/chat/completions", body)
    assert grammars.compiled == compiled
    assert_no_block_leaked(await wait_metrics(url, idle, "idle"))


@pytest.mark.parametrize(("extra", "param", "needle"), [
    ({"response_format": response_format({"type": "frobnicate"})}, "response_format", 'Unsupported type "frobnicate"'),
    ({"response_format": response_format({"properties": {"a": {"$ref": "#/$defs/none"}}})}, "response_format",
     "invalid json schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "needs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}}, "response_format",
     "a JSON schema is an object"),
    ({"guided_regex": "(unclosed"}, "guided_regex", "invalid regex"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar", "is not defined"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_choice": []}, "guided_choice", "a non-empty list of strings"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs", "not supported"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "one grammar per request"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos", "not with response_format"),
])
async def test_invalid_grammars_are_400_naming_the_field(tiny: tuple, extra: dict, param: str, needle: str) -> None:
    _, url = tiny
    status, body = await post(url, "/v1/chat/completions", {"model": MODEL, "messages": ASK, **extra})
    assert status == 400, body
    assert body["error"]["param"] == param and needle in body["error"]["message"], body


async def test_through_pd_the_first_token_obeys_the_grammar(prefill_pair: list[Proc]) -> None:
    """The decode side samples the first token from the worker's shipped logits: the grammar masks it there."""
    regex = r"Z[0-9]{3}"
    async with in_process("decode", **decode_settings(prefill_pair[:1], True)) as (_s, url):
        base = {"model": MODEL, "prompt": "The quick brown fox", "temperature": 0, "max_tokens": 10}
        _, free = await post(url, "/v1/completions", base)
        assert not free["choices"][0]["text"].startswith("Z")  # so the mask is what decides the first token
        _, out = await post(url, "/v1/completions", {**base, "n": 2, "temperature": 1.0, "seed": 2,
                                                     "guided_regex": regex})
        _, greedy = await post(url, "/v1/completions", {**base, "guided_regex": regex})
        for ch in out["choices"] + greedy["choices"]:
            assert ch["finish_reason"] == "stop" and re.fullmatch(regex, ch["text"]), ch
        assert_no_block_leaked(await wait_metrics(url, idle, "idle"))


def nested_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize(("extra", "param", "needle"), [
    # 100 levels of properties: 201 objects deep, within what the body parser takes, beyond the schema bound
    ({"response_format": response_format(nested_schema(100))}, "response_format", f"at most {MAX_SCHEMA_DEPTH}"),
    ({"structured_outputs": {"json": nested_schema(100)}}, "structured_outputs", f"at most {MAX_SCHEMA_DEPTH}"),
    # As a string a schema escapes the body parser's bound: deeper than json.loads goes
    ({"guided_json": '{"properties": {"a": ' * 1_500 + "{}" + "}}" * 1_500}, "guided_json", "nested too deep to parse"),
])
async def test_a_schema_nested_too_deep_is_a_400_naming_the_field_and_the_bound(tiny: tuple, extra: dict, param: str,
                                                                               needle: str) -> None:
    _, url = tiny
    status, body = await post(url, "/v1/chat/completions", {"model": MODEL, "messages": ASK, **extra})
    assert status == 400, body
    assert body["error"]["param"] == param and needle in body["error"]["message"], body
