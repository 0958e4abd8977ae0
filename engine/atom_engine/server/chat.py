"""Chat messages to a prompt: the checkpoint's chat template (tokenizer_config.json, Jinja) or a plain one."""

from __future__ import annotations

import json
from pathlib import Path

from atom_engine.server.protocol import ChatMessage


def plain_template(messages: list[ChatMessage]) -> str:
    """For builtin:tiny and checkpoints without a template: one block per message, then the assistant's turn."""
    return "".join(f"<|{m.role}|>\n{m.text()}\n" for m in messages) + "<|assistant|>\n"


class ChatTemplate:
    def __init__(self, model_source: str) -> None:
        self._template = None
        config = Path(model_source) / "tokenizer_config.json"
        if config.is_file():
            source = json.loads(config.read_text()).get("chat_template")
            if isinstance(source, str):
                from jinja2.sandbox import ImmutableSandboxedEnvironment

                self._template = ImmutableSandboxedEnvironment().from_string(source)

    def render(self, messages: list[ChatMessage]) -> str:
        if self._template is None:
            return plain_template(messages)
        return self._template.render(messages=[{"role": m.role, "content": m.text()} for m in messages],
                                     add_generation_prompt=True)
