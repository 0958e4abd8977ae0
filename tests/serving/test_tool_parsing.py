"""Tool calls out of the model's text (Hermes format), whole and streamed in pieces of any size: streamed, a call's
id and name come first and its arguments follow in pieces, which joined by index (as OpenAI's clients join them)
give the whole-text parse's calls."""

from __future__ import annotations

import json

import pytest
from atom_engine.server.tool_stream import CallDelta, ToolStream
from atom_engine.server.tools import parse_tool_calls

TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')


def joined(deltas: list[CallDelta]) -> list[dict]:
    """The calls a client assembles from the deltas (by index: the first names the call, the rest add arguments)."""
    calls: dict[int, dict] = {}
    for d in deltas:
        entry = d.openai()
        if entry is None:
            continue
        if "id" in entry:
            assert d.index not in calls, "a call starts once"
            calls[d.index] = {"index": d.index, "id": entry["id"], "type": entry["type"],
                              "function": {"name": entry["function"]["name"], "arguments": ""}}
        calls[d.index]["function"]["arguments"] += entry["function"]["arguments"]
    return [calls[i] for i in sorted(calls)]


def streamed(text: str, step: int, parallel: bool = True, ends: bool = True) -> tuple[str, list[CallDelta]]:
    """``text`` fed in pieces of ``step`` characters; ``ends``: the last piece ends the output."""
    ts, content, deltas = ToolStream(parallel=parallel), "", []
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    for k, piece in enumerate(pieces):
        sent, new = ts.feed(piece, ends and k == len(pieces) - 1)
        assert "<tool" not in sent or not parse_tool_calls(text)[1]  # a call's text never leaks as content
        content += sent
        deltas += new
    return content, deltas


def test_calls_and_the_content_around_them() -> None:
    content, calls = parse_tool_calls(TEXT)
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize("text", ["no calls here", "<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{\"a\": 1}",
                                  '<tool_call>{"arguments": {}}</tool_call>'])
def test_text_without_a_valid_call_stays_content(text: str) -> None:
    assert parse_tool_calls(text) == (text, [])


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 11, 1000])
def test_a_stream_in_pieces_gives_what_the_whole_text_gives(step: int) -> None:
    content, deltas = streamed(TEXT, step)
    whole_content, whole_calls = parse_tool_calls(TEXT)
    calls = joined(deltas)
    assert content == whole_content and [c["index"] for c in calls] == [0, 1]
    assert [c["function"] for c in calls] == [c["function"] for c in whole_calls]
    assert [d.index for d in deltas if d.done] == [0, 1] and not any(d.cut for d in deltas)


def test_arguments_stream_in_pieces_before_the_call_ends() -> None:
    """Character by character: the call's first delta has its id, type and name (and what it has of the
    arguments: their opening brace), then the arguments come as they are written, each piece once, all before
    the end tag arrives."""
    text = TEXT[TEXT.index("<tool_call>") : TEXT.index("</tool_call>")]  # the end tag not yet written
    content, deltas = streamed(text, 1, ends=False)
    first = deltas[0].openai()
    assert first == {"index": 0, "id": first["id"], "type": "function",
                     "function": {"name": "get_weather", "arguments": "{"}}
    pieces = [d.arguments for d in deltas]
    assert len(pieces) > 10 and "".join(pieces) == '{"city": "Paris"}'
    assert all(d.openai() == {"index": 0, "function": {"arguments": d.arguments}} for d in deltas[1:] if d.arguments)
    assert content == "" and not any(d.done for d in deltas)


def test_a_call_in_another_shape_is_sent_whole_and_a_malformed_one_stays_text() -> None:
    other = '<tool_call>\n{"arguments": {"zone": "CET"}, "name": "get_time"}\n</tool_call>'
    _, deltas = streamed(other, 1)
    assert len(deltas) == 1 and deltas[0].done
    assert joined(deltas)[0]["function"] == parse_tool_calls(other)[1][0]["function"]
    malformed = 'See <tool_call>\n{"name": get_time}\n</tool_call>'
    assert streamed(malformed, 3) == (malformed, [])


def test_a_call_cut_off_ends_with_the_arguments_it_has() -> None:
    content, deltas = streamed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', 4)
    assert content == "" and deltas[-1].done and deltas[-1].cut
    assert joined(deltas)[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Pa'}


def test_a_stream_without_calls_is_its_text_and_an_unclosed_call_is_text_at_the_end() -> None:
    ts = ToolStream()
    assert ts.feed("Hello <", False) == ("Hello", [])  # "<" may start a call, " " may precede one: held
    assert ts.feed("b>", False) == (" <b>", [])
    assert ts.feed(" <tool_call>{", False) == ("", [])
    assert ts.feed("", True) == (" <tool_call>{", [])


def test_without_parallel_calls_only_the_first_call_is_returned() -> None:
    content, calls = parse_tool_calls(TEXT + "\nDone.", parallel=False)
    assert content == parse_tool_calls(TEXT + "\nDone.")[0]  # the dropped call's text is not content either
    assert "get_time" not in content
    assert [c["function"]["name"] for c in calls] == ["get_weather"]


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_without_parallel_calls_a_stream_gives_the_first_call_as_the_whole_text_does(step: int) -> None:
    text = TEXT + "\nDone."
    content, deltas = streamed(text, step, parallel=False)
    whole_content, whole_calls = parse_tool_calls(text, parallel=False)
    calls = joined(deltas)
    assert content == whole_content and [c["index"] for c in calls] == [0]
    assert [c["function"] for c in calls] == [c["function"] for c in whole_calls]
