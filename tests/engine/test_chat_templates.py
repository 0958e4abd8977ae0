"""The engine's ``smollm2-hermes`` template against SmolLM2-135M-Instruct's own (the converted checkpoint's
``chat_template.jinja``, ``make model``): a chat without tools renders character for character as the
checkpoint's own renders it, on a seeded family of conversations, so serving the model with tools changes no
plain chat's prompt; with tools, each tool's signature is in the system turn and calls and results render as the
engine writes and reads them."""

from __future__ import annotations

import json
import random

import pytest
from atom_engine.server.chat import ChatTemplate
from atom_engine.server.protocol import ChatMessage

SOURCE = "builtin:smollm2-135m"
WORDS = ["Paris", "weather", "the", "is", "ok?", "café", "naïve", "\n", "  ", "{\"a\": 1}", "<b>", "日本", "'", "\\"]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))


def conversation(rng: random.Random) -> list[ChatMessage]:
    """An optional system turn, then user and assistant turns alternating, ending with a user's."""
    messages = [ChatMessage(role="system", content=text(rng))] if rng.random() < 0.5 else []
    for _ in range(rng.randint(0, 3)):
        messages += [ChatMessage(role="user", content=text(rng)), ChatMessage(role="assistant", content=text(rng))]
    return [*messages, ChatMessage(role="user", content=text(rng))]


@pytest.fixture(scope="module")
def templates() -> tuple[ChatTemplate, ChatTemplate]:
    own, ours = ChatTemplate(SOURCE, "checkpoint"), ChatTemplate(SOURCE)
    assert own.source != ours.source and ours.tool_format == "hermes" and own.tool_format is None
    return own, ours


@pytest.mark.parametrize("seed", range(40))
def test_a_chat_without_tools_renders_as_smollm2s_own_template(templates: tuple[ChatTemplate, ChatTemplate],
                                                             seed: int) -> None:
    own, ours = templates
    messages = conversation(random.Random(seed))
    for generation_prompt in (True, False):
        assert ours.render(messages, generation_prompt) == own.render(messages, generation_prompt)


def test_tools_calls_and_results_render_in_the_hermes_layout(templates: tuple[ChatTemplate, ChatTemplate]) -> None:
    _, ours = templates
    arguments = json.dumps({"city": "Paris"})  # as the API carries them: a JSON string
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    messages = [ChatMessage(role="user", content="Weather in Paris?"),
                ChatMessage(role="assistant", content=None, tool_calls=[call]),
                ChatMessage(role="tool", tool_call_id="call_1", content='{"temperature_c": 18}')]
    prompt = ours.render(messages, True, tools=[TOOL])
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n") and f"<tools>\n{json.dumps(TOOL)}\n</tools>" in system
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            "</tool_call><|im_end|>") in prompt
    assert prompt.endswith('<|im_start|>tool\n{"temperature_c": 18}<|im_end|>\n<|im_start|>assistant\n')
