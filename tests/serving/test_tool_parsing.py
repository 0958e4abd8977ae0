"""Tool calls out of the model's text (Hermes format), whole and streamed in pieces of any size."""

from __future__ import annotations

import json

import pytest
from atom_engine.server.tools import ToolStream, parse_tool_calls

TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')


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
    ts, content, calls = ToolStream(), "", []
    pieces = [TEXT[i : i + step] for i in range(0, len(TEXT), step)]
    for k, piece in enumerate(pieces):
        text, new = ts.feed(piece, k == len(pieces) - 1)
        assert "<tool" not in text  # a call's text never leaks as content
        content += text
        calls += new
    whole_content, whole_calls = parse_tool_calls(TEXT)
    assert content == whole_content and [c["index"] for c in calls] == [0, 1]
    assert [c["function"] for c in calls] == [c["function"] for c in whole_calls]


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
    ts, content, calls = ToolStream(parallel=False), "", []
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    for k, piece in enumerate(pieces):
        sent, new = ts.feed(piece, k == len(pieces) - 1)
        content += sent
        calls += new
    whole_content, whole_calls = parse_tool_calls(text, parallel=False)
    assert content == whole_content and [c["index"] for c in calls] == [0]
    assert [c["function"] for c in calls] == [c["function"] for c in whole_calls]
