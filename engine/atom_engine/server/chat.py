"""Chat messages to a prompt: the checkpoint's chat template (Jinja) or a plain one.

The template is the one the engine setting ``chatTemplate`` picks: one the engine ships
(:mod:`atom_engine.model.chat_templates`; unset, a built-in model's own choice: builtin:smollm2-135m's is
``smollm2-hermes``, which renders tools) or the checkpoint's (``checkpoint``, and unset for any other model), read
from ``chat_template.jinja`` (where transformers 5 saves it) or else ``tokenizer_config.json``'s
``chat_template`` (a string, or a list of named templates of which "default" is used). It renders as
transformers' ``apply_chat_template`` renders it (transformers/utils/chat_template_utils.py,
``_compile_jinja_template`` and ``render_jinja_template``): a sandbox with trim_blocks, lstrip_blocks and loop
controls, its ``tojson``/``raise_exception``/``strftime_now`` helpers, and the tokenizer's special tokens
(``bos_token``, ``eos_token``, ...) as variables. The engine then encodes the text without adding special tokens,
as ``apply_chat_template(tokenize=True)`` does, so the prompt tokens are the same.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from atom_engine.model.builtin import checkpoint_path, lookup
from atom_engine.model.chat_templates import CHAT_TEMPLATES
from atom_engine.server.error_responses import ApiError
from atom_engine.server.protocol import ChatMessage
from atom_engine.server.tools import template_tool_format

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def plain_template(messages: list[ChatMessage]) -> str:
    """For builtin:tiny and checkpoints without a template: one block per message, then the assistant's turn."""
    return "".join(f"<|{m.role}|>\n{m.text()}\n" for m in messages) + "<|assistant|>\n"


def read_template(path: Path) -> tuple[str | None, dict[str, str]]:
    """The checkpoint's chat template source (None when it has none) and its special tokens by name."""
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    specials = {}
    for name in SPECIAL_TOKENS:
        token = config.get(name)
        if isinstance(token, dict):  # an AddedToken saved as {"content": ..., ...}
            token = token.get("content")
        if isinstance(token, str):
            specials[name] = token
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(), specials
    source = config.get("chat_template")
    if isinstance(source, list):
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    return (source if isinstance(source, str) else None), specials


def template_source(model_source: str, choice: str | None = None) -> tuple[str | None, dict[str, str]]:
    """The chat template a model is served with (None: the plain one) and its special tokens by name.
    ``choice``: the ``chatTemplate`` setting (None: the built-in model's own choice, else the checkpoint's)."""
    path = checkpoint_path(model_source)
    source, specials = read_template(path) if path is not None else (None, {})
    if choice is None:
        builtin = lookup(model_source)
        choice = builtin.chat_template if builtin is not None else None
    return (CHAT_TEMPLATES[choice] if choice in CHAT_TEMPLATES else source), specials


def _environment():  # noqa: ANN202 (a jinja2 Environment; jinja2 is imported lazily)
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: object, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        # transformers overrides jinja's tojson, which would escape HTML characters
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def template_reads(source: str) -> set[str]:
    """The top-level variables a template reads (``messages``, ``tools``, ...)."""
    import jinja2.meta

    return set(jinja2.meta.find_undeclared_variables(_environment().parse(source)))


class ChatTemplate:
    def __init__(self, model_source: str, choice: str | None = None) -> None:
        """``choice``: the ``chatTemplate`` setting (:func:`template_source`)."""
        self._template = None
        self.tool_format: str | None = None  # the tool-call format it teaches (atom_engine.server.tools)
        self.source, self._specials = template_source(model_source, choice)
        if self.source is not None:
            self._template = _environment().from_string(self.source)
            self.tool_format = template_tool_format(self.source, template_reads(self.source))

    @property
    def plain(self) -> bool:
        return self._template is None

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> str:
        """``tools``: as transformers' ``apply_chat_template(tools=...)`` passes them (only to a template that
        reads them: :func:`atom_engine.server.tools.check_template`).

        A template that refuses the messages (its ``raise_exception``: roles out of order, a tool result with no
        call before it) is a 400 with the template's words (``param: "messages"``): the conversation is what
        is wrong, and the client can fix it."""
        if self._template is None:
            return plain_template(messages)
        import jinja2

        extra = {"tools": tools} if tools else {}
        try:
            return self._template.render(messages=[m.template_dict() for m in messages],
                                         add_generation_prompt=add_generation_prompt, **extra, **self._specials)
        except jinja2.TemplateError as exc:
            raise ApiError(400, f"messages: the model's chat template refused them: {exc.message or exc}",
                           param="messages", code="invalid_value") from None
