"""Tool calling through the chat template: tools rendered as transformers renders them, ``required`` and a named
function enforced by the grammar (so even random weights emit valid calls), calls parsed into
``message.tool_calls`` with ``finish_reason: "tool_calls"``, streamed as tool-call deltas, tool calls and results
carried back into the prompt, and templates without tool support refused."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import jsonschema
import pytest
import pytest_asyncio
import transformers
from atom_engine.server.chat import ChatTemplate

from tests.serving.conftest import MODEL, client, in_process
from tests.serving.hf_checkpoint import save_checkpoint
from tests.serving.tool_templates import HERMES, SMOLLM2

pytestmark = pytest.mark.asyncio(loop_scope="session")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}
CLOCK = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6},
                                          "hours": {"type": "integer", "minimum": 0, "maximum": 23}},
         "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
ASK = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Paris?"}]
# A Hermes template that checks the history as real ones do (Qwen3's, Mistral's): raise_exception on a bad order.
ORPHAN_RESULT = "a tool message must follow an assistant message with tool calls"
STRICT = ("{%- for message in messages %}{%- if message.role == 'tool' and (loop.first or loop.previtem.role not in"
          " ('assistant', 'tool')) %}{{ raise_exception('" + ORPHAN_RESULT + "') }}{%- endif %}{%- endfor %}"
          + HERMES)
ORPHAN = [*ASK, {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]


def checkpoint(tmp: Path, template: str) -> Path:
    save_checkpoint(tmp)
    (tmp / "chat_template.jinja").write_text(template)
    return tmp


@pytest.fixture(scope="module")
def hermes_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoint(tmp_path_factory.mktemp("hermes"), HERMES)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def hermes(hermes_path: Path):  # noqa: ANN201
    async with in_process("standalone", model_source=str(hermes_path), lanes=4, kv_blocks=6, prefix_cache=True,
                          max_seq_len=1024, prefill_chunk=128) as (_server, url):
        yield url


async def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}{path}", json=body) as r:
        return r.status, await r.json()


def assert_valid_calls(calls: list, names: set[str]) -> None:
    assert calls
    for call in calls:
        fn = call["function"] if isinstance(call, dict) else call.function.model_dump()
        assert fn["name"] in names
        jsonschema.validate(json.loads(fn["arguments"]), SCHEMAS[fn["name"]])


async def test_tools_render_as_transformers_renders_them(hermes: str, hermes_path: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(hermes_path)
    want = tok.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    want = list(want["input_ids"] if not isinstance(want, list) else want)
    _, got = await post(hermes, "/tokenize", {"messages": ASK, "tools": TOOLS})
    assert got["tokens"] == want
    status, out = await post(hermes, "/v1/chat/completions", {"model": MODEL, "messages": ASK, "tools": TOOLS,
                                                              "max_tokens": 1})
    assert status == 200 and out["usage"]["prompt_tokens"] == len(want)


async def test_required_gives_one_valid_call_for_every_sample(hermes: str) -> None:
    out = await client(hermes).chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                       parallel_tool_calls=False, n=4, temperature=1.0, seed=1,
                                                       max_tokens=280)
    for ch in out.choices:
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        assert len(ch.message.tool_calls) == 1
        assert_valid_calls(ch.message.tool_calls, set(SCHEMAS))
        assert all(c.type == "function" and c.id.startswith("call_") for c in ch.message.tool_calls)


async def test_required_with_parallel_calls_may_call_several(hermes: str) -> None:
    """Random weights never choose to stop calling: a choice may run into max_tokens mid-call; every call it
    completed is valid."""
    out = await client(hermes).chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                       n=4, temperature=1.0, seed=1, max_tokens=280)
    assert max(len(ch.message.tool_calls or []) for ch in out.choices) >= 2
    for ch in out.choices:
        assert ch.finish_reason in ("tool_calls", "length")
        assert_valid_calls(ch.message.tool_calls, set(SCHEMAS))


async def test_a_named_function_is_the_one_called_once(hermes: str) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    out = await client(hermes).chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                                       n=3, temperature=1.0, seed=2, max_tokens=280)
    for ch in out.choices:
        assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1
        assert_valid_calls(ch.message.tool_calls, {"get_time"})


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_streamed_calls_arrive_as_tool_call_deltas(hermes: str, tool_choice: object) -> None:
    args = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=1.0, seed=5,
                max_tokens=280, parallel_tool_calls=False)
    whole = await client(hermes).chat.completions.create(**args)
    stream = await client(hermes).chat.completions.create(**args, stream=True)
    calls: dict[int, dict] = {}
    pieces: dict[int, int] = {}  # argument fragments per call
    content, finish = "", None
    async for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                if d.index not in calls:  # a call's first delta names it
                    assert d.id and d.id.startswith("call_") and d.function.name, d
                entry = calls.setdefault(d.index, {"id": d.id, "function": {"name": "", "arguments": ""}})
                entry["function"]["name"] += d.function.name or ""
                entry["function"]["arguments"] += d.function.arguments or ""
                pieces[d.index] = pieces.get(d.index, 0) + bool(d.function.arguments)
            finish = ch.finish_reason or finish
    assert finish == "tool_calls" and content == ""
    assert all(n >= 2 for n in pieces.values()), pieces  # the arguments stream in fragments, not whole
    streamed = [calls[i] for i in sorted(calls)]
    assert_valid_calls(streamed, set(SCHEMAS))
    assert [c["function"] for c in streamed] == [c.function.model_dump() for c in whole.choices[0].message.tool_calls]


async def test_auto_leaves_the_text_free_and_answers_in_content(hermes: str) -> None:
    out = await client(hermes).chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=8,
                                                       temperature=0)
    ch = out.choices[0]
    assert ch.message.tool_calls is None and ch.finish_reason in ("stop", "length") and ch.message.content


ANSWER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                           "degrees": {"type": "integer", "minimum": -50, "maximum": 60}},
          "required": ["city", "degrees"]}
ANSWER_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
async def test_a_forced_call_with_an_answer_format_is_calls_only(hermes: str, tool_choice: object) -> None:
    """The format is the answering turn's: the turn that must call samples under the calls' grammar alone."""
    out = await client(hermes).chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, response_format=ANSWER_FORMAT, n=3,
        temperature=1.0, seed=3, max_tokens=280, parallel_tool_calls=False)
    names = {"get_time"} if isinstance(tool_choice, dict) else set(SCHEMAS)
    for ch in out.choices:
        assert ch.finish_reason == "tool_calls" and ch.message.content is None, ch
        assert len(ch.message.tool_calls) == 1
        assert_valid_calls(ch.message.tool_calls, names)


async def test_auto_with_an_answer_format_samples_a_call_or_the_answer_and_nothing_else(
        hermes: str, hermes_path: Path) -> None:
    """Under auto the turn may call or answer: every sample is one or the other, and biasing the first token of
    each branch shows both are open (before, the format's grammar alone ruled every call out)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(hermes_path)
    args = dict(model=MODEL, messages=ASK, tools=TOOLS, response_format=ANSWER_FORMAT, max_tokens=280,
                temperature=1.0, seed=4, parallel_tool_calls=False)
    branches = {}
    for start in ("<tool_call>", '{"city"'):
        first = tokenizer.encode(start, add_special_tokens=False)[0]
        out = await client(hermes).chat.completions.create(**args, n=3, logit_bias={str(first): 100})
        for ch in out.choices:
            if ch.message.tool_calls:
                assert ch.finish_reason == "tool_calls" and ch.message.content is None
                assert_valid_calls(ch.message.tool_calls, set(SCHEMAS))
            else:
                assert ch.finish_reason == "stop", ch
                jsonschema.validate(json.loads(ch.message.content), ANSWER)
        branches[start] = {"call" if ch.message.tool_calls else "answer" for ch in out.choices}
    assert branches == {"<tool_call>": {"call"}, '{"city"': {"answer"}}
    unbiased = await client(hermes).chat.completions.create(**args, n=6)
    for ch in unbiased.choices:
        if not ch.message.tool_calls:
            jsonschema.validate(json.loads(ch.message.content), ANSWER)


TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')


@pytest.mark.parametrize("stream", [False, True])
async def test_parallel_tool_calls_false_under_auto_returns_only_the_first_call(hermes: str, hermes_path: Path,
                                                                                stream: bool) -> None:
    """Under auto a format is the answer's, beside the calls (either may be written): a one-option choice that
    begins with text, its first token biased so the model takes the choice, makes the model write two calls."""
    text = "Let me check.\n" + TWO_CALLS
    first = transformers.AutoTokenizer.from_pretrained(hermes_path).encode(text, add_special_tokens=False)[0]
    names = {}
    for parallel in (True, False):
        out = await client(hermes).chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, max_tokens=200, parallel_tool_calls=parallel, stream=stream,
            logit_bias={str(first): 100}, extra_body={"structured_outputs": {"choice": [text]}})
        if stream:
            calls, finish = [], None
            async for chunk in out:
                for ch in chunk.choices:
                    calls += [d for d in ch.delta.tool_calls or [] if d.id]  # a call's first delta names it
                    finish = ch.finish_reason or finish
        else:
            calls, finish = out.choices[0].message.tool_calls, out.choices[0].finish_reason
        assert finish == "tool_calls"
        names[parallel] = [c.function.name for c in calls]
    assert names == {True: ["get_weather", "get_time"], False: ["get_weather"]}


async def test_calls_and_results_are_carried_back_into_the_prompt(hermes: str, hermes_path: Path) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city": "Paris", "unit": "C"}'}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]
    tok = transformers.AutoTokenizer.from_pretrained(hermes_path)
    hf_messages = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]
    want = tok.apply_chat_template(hf_messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    _, got = await post(hermes, "/tokenize", {"messages": messages, "tools": TOOLS})
    text = tok.decode(got["tokens"])
    assert text == want
    assert '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}' in text and "21 degrees" in text
    status, out = await post(hermes, "/v1/chat/completions", {"model": MODEL, "messages": messages, "tools": TOOLS,
                                                              "max_tokens": 2})
    assert status == 200, out


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "one of"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "a tool is"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "unique"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'auto', 'required', 'none'"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"},
      "structured_outputs": {"choice": ["a"]}}, "structured_outputs", "one grammar per request"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages", "tool_calls[0]"),
])
async def test_bad_tool_requests_are_400_naming_the_field(hermes: str, body: dict, param: str, needle: str) -> None:
    status, out = await post(hermes, "/v1/chat/completions", {"model": MODEL, "messages": ASK, **body})
    assert status == 400 and out["error"]["param"] == param and needle in out["error"]["message"], out


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def strict(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = checkpoint(tmp_path_factory.mktemp("strict"), STRICT)
    async with in_process("standalone", model_source=str(path), lanes=1, kv_blocks=2, prefix_cache=False,
                          max_seq_len=1024) as (_s, url):
        yield url


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
async def test_a_history_the_template_refuses_is_a_400_with_its_message(strict: str, path: str) -> None:
    status, out = await post(strict, path, {"model": MODEL, "messages": ORPHAN, "tools": TOOLS})
    assert status == 400, out
    assert set(out["error"]) == {"message", "type", "param", "code"}
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["param"] == "messages"
    assert ORPHAN_RESULT in out["error"]["message"]


async def test_a_tool_result_after_its_call_passes_the_templates_check(strict: str) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}, ORPHAN[-1]]
    status, out = await post(strict, "/v1/chat/completions", {"model": MODEL, "messages": messages, "tools": TOOLS,
                                                              "max_tokens": 1})
    assert status == 200, out


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def chatml(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = checkpoint(tmp_path_factory.mktemp("chatml"), SMOLLM2)
    async with in_process("standalone", model_source=str(path), lanes=1, kv_blocks=2, prefix_cache=False) as (_s,
                                                                                                               url):
        yield url


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
async def test_a_template_without_tool_support_is_refused_naming_why(chatml: str, tool_choice: str) -> None:
    status, out = await post(chatml, "/v1/chat/completions", {"model": MODEL, "messages": ASK, "tools": TOOLS,
                                                              "tool_choice": tool_choice})
    assert status == 400 and out["error"]["param"] == "tools" and out["error"]["code"] == "tools_unsupported"
    assert "does not render tools" in out["error"]["message"]
    # told not to call them, the tools change nothing: served
    status, out = await post(chatml, "/v1/chat/completions", {"model": MODEL, "messages": ASK, "tools": TOOLS,
                                                              "tool_choice": "none", "max_tokens": 2})
    assert status == 200 and "tool_calls" not in out["choices"][0]["message"]


async def test_tool_history_on_a_template_without_tool_support_is_refused(chatml: str) -> None:
    messages = [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_weather", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "sunny"}]
    status, out = await post(chatml, "/v1/chat/completions", {"model": MODEL, "messages": messages})
    assert status == 400 and out["error"]["param"] == "messages" and "does not render tools" in out["error"]["message"]


async def test_the_builtin_models_own_templates_lack_tools_and_smollm2_is_served_with_the_engines() -> None:
    assert ChatTemplate("builtin:tiny").tool_format is None  # no template at all
    # SmolLM2-135M-Instruct's own never reads `tools`; by default it is served with the engine's Hermes one
    assert ChatTemplate("builtin:smollm2-135m", "checkpoint").tool_format is None
    assert ChatTemplate("builtin:smollm2-135m").tool_format == "hermes"
    async with in_process("standalone", lanes=1, kv_blocks=2, prefix_cache=False) as (_s, url):
        status, out = await post(url, "/v1/chat/completions", {"model": MODEL, "messages": ASK, "tools": TOOLS})
    assert status == 400 and "builtin:tiny does not render tools" in out["error"]["message"]
