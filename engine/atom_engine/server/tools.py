"""Tool calling: a request's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` checked, the grammar that
enforces ``required`` and a named function, and the model's tool calls parsed out of its text (whole or as a
stream).

Tools reach the model only through its chat template (transformers' ``apply_chat_template(tools=...)``): a
template that never reads ``tools`` would drop them, so such a model is refused (a 400 naming why), not served
as if there were none. The calls come back in the format the template taught the model; the one this engine
parses is the Hermes format of Qwen2.5/Qwen3, Hermes and SmolLM3 (vLLM's ``hermes`` parser)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A template that renders tools in another format is refused too, naming the format it lacks.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atom_engine.server.error_responses import ApiError
from atom_engine.structured.spec import GrammarSpec

if TYPE_CHECKING:
    from atom_engine.server.protocol import ChatCompletionRequest

CALL_BEGIN, CALL_END = "<tool_call>", "</tool_call>"
HERMES = "hermes"
NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")  # OpenAI's rule for a function name
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_CALL = re.compile(re.escape(CALL_BEGIN) + r"\s*(.*?)\s*" + re.escape(CALL_END), re.DOTALL)


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def template_tool_format(source: str | None, reads: set[str]) -> str | None:
    """The tool-call format a chat template teaches (None: it does not render tools). ``reads``: the template's
    top-level variables."""
    if source is None or "tools" not in reads:
        return None
    return HERMES if CALL_BEGIN in source else "unknown"


@dataclass(frozen=True)
class ToolRequest:
    """``tools`` as the chat template takes them (``{"type": "function", "function": {...}}``); ``choice``:
    "auto", "required", "none" or a function's name."""

    tools: tuple[dict[str, Any], ...]
    choice: str
    parallel: bool

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def calls(self) -> bool:
        """The output may hold tool calls (to parse)."""
        return bool(self.tools) and self.choice != "none"

    def grammar(self) -> GrammarSpec | None:
        """``required``: one or more calls (one unless ``parallel``) of the given tools and nothing else; a named
        function: one call of it. ``auto`` and ``none`` leave the text free (as vLLM does)."""
        if self.choice in ("auto", "none"):
            return None
        tools = [t for t in self.tools if t["function"]["name"] == self.choice] if self.choice != "required" \
            else list(self.tools)
        tags = [{"type": "tag", "begin": f'{CALL_BEGIN}\n{{"name": "{t["function"]["name"]}", "arguments": ',
                 "content": {"type": "json_schema", "json_schema": t["function"]["parameters"],
                             "max_whitespace_cnt": 1},
                 "end": f"}}\n{CALL_END}"} for t in tools]
        fmt: dict[str, Any] = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
                               "stop_after_first": self.choice != "required" or not self.parallel}
        return GrammarSpec("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}))


def tool_request(tools: list[Any] | None, tool_choice: Any, parallel: bool | None) -> ToolRequest | None:
    """The request's tools, checked (a 400 naming the field); None when it has none."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise _bad("tool_choice", f"tool_choice: {tool_choice!r} needs tools")
        return None
    checked: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise _bad("tools", f"tools[{i}]: a tool is {{'type': 'function', 'function': {{'name': ...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise _bad("tools", f"tools[{i}].function.name: 1-64 of a-z, A-Z, 0-9, '_', '.', '-'; got {name!r}")
        params = fn.get("parameters", EMPTY_PARAMETERS)
        if not isinstance(params, dict):
            raise _bad("tools", f"tools[{i}].function.parameters: a JSON schema object")
        entry = {k: v for k, v in fn.items() if k in ("name", "description")} | {"parameters": params}
        checked.append({"type": "function", "function": entry})
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise _bad("tools", f"tools: function names must be unique; got {names}")
    if tool_choice is None:
        choice = "auto"
    elif isinstance(tool_choice, str):
        if tool_choice not in ("auto", "required", "none"):
            raise _bad("tool_choice", f"tool_choice: 'auto', 'required', 'none' or a function; got {tool_choice!r}")
        choice = tool_choice
    else:
        named = tool_choice.get("function") if isinstance(tool_choice, dict) else None
        choice = named.get("name") if isinstance(named, dict) else None
        if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or choice not in names:
            raise _bad("tool_choice", f"tool_choice: {{'type': 'function', 'function': {{'name': one of {names}}}}};"
                       f" got {tool_choice!r}")
    return ToolRequest(tuple(checked), choice, True if parallel is None else parallel)


@dataclass(frozen=True)
class ChatTools:
    """What a chat request's tools mean for serving it: the tools to parse calls for (None: free text), the
    tools the template renders, and the grammar that enforces ``required`` / a named function."""

    parse: ToolRequest | None
    rendered: list[dict[str, Any]] | None
    grammar: tuple[str, GrammarSpec] | None


def chat_tools(req: ChatCompletionRequest, tool_format: str | None, model: str) -> ChatTools:
    tools = req.tool_request()
    check_template(tools, req.history_calls, tool_format, model)
    rendered = list(tools.tools) if tools is not None and tool_format is not None else None
    spec = tools.grammar() if tools is not None else None
    return ChatTools(tools if tools is not None and tools.calls else None, rendered,
                     ("tool_choice", spec) if spec is not None else None)


def chat_message(text: str, tools: ToolRequest | None) -> tuple[dict[str, Any], bool]:
    """The assistant message of a whole response (OpenAI's shape), and whether it calls tools."""
    content: str | None = text
    calls: list[dict[str, Any]] = []
    if tools is not None:
        content, calls = parse_tool_calls(text, tools.parallel)
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    if calls:
        message["tool_calls"] = calls
    return message, bool(calls)


def check_template(tools: ToolRequest | None, history_calls: bool, fmt: str | None, model: str) -> None:
    """Refuse tools (and tool calls in the history) the chat template would drop or whose calls this engine
    cannot read back (a 400 naming why)."""
    if not history_calls and (tools is None or tools.choice == "none"):
        return  # no tools, or tools the model is told not to call: nothing depends on the template
    param = "tools" if tools is not None and tools.choice != "none" else "messages"
    if fmt is None:
        raise ApiError(400, f"{param}: the chat template of {model} does not render tools (it never reads"
                       " `tools`), so the model would never see them; serve a checkpoint whose chat template"
                       " supports tools", param=param, code="tools_unsupported")
    if fmt != HERMES:
        raise ApiError(400, f"{param}: the chat template of {model} renders tools, but not in a tool-call format"
                       f" this engine parses (it parses {CALL_BEGIN}...{CALL_END}, the Hermes format)",
                       param=param, code="tools_unsupported")


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _parse_call(body: str) -> dict[str, Any] | None:
    """One call's JSON to OpenAI's ``tool_calls`` entry (``arguments`` as a JSON string); None if malformed."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": _call_id(), "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str, parallel: bool = True) -> tuple[str | None, list[dict[str, Any]]]:
    """The content outside the calls (None when only calls) and the calls. A malformed call stays content.
    ``parallel`` false (``parallel_tool_calls: false``): at most one call, the first; the model's further calls
    are dropped, neither calls nor content (under ``auto`` the grammar leaves the text free, so only the parse
    can keep OpenAI's promise of one call)."""
    calls: list[dict[str, Any]] = []
    content: list[str] = []
    at = 0
    for m in _CALL.finditer(text):
        call = _parse_call(m.group(1))
        if call is None:
            continue
        content.append(text[at : m.start()])
        if parallel or not calls:
            calls.append(call)
        at = m.end()
    content.append(text[at:])
    rest = "".join(content)
    if calls:
        rest = rest.strip()
    return (rest or None) if calls else text, calls


@dataclass
class ToolStream:
    """The calls of a streamed output as they complete: text that may start a call is held back, a call's text
    is held until its end tag, then sent as one ``tool_calls`` delta (OpenAI's clients join a call's deltas by
    ``index``; a whole call in one delta is one such sequence). ``parallel`` false: calls after the first are
    dropped, as :func:`parse_tool_calls` drops them."""

    parallel: bool = True
    called: int = 0
    _buf: str = ""
    _space: str = ""  # whitespace held: dropped between and around calls, sent before other text
    _in_call: bool = False
    sent_text: bool = False

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """The content to send now and the calls completed by ``text``."""
        self._buf += text
        content, calls = [], []
        while True:
            if not self._in_call:
                i = self._buf.find(CALL_BEGIN)
                if i < 0:
                    keep = 0 if final else _partial_suffix(self._buf, CALL_BEGIN)
                    content.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                content.append(self._buf[:i])
                self._buf, self._in_call = self._buf[i:], True
            j = self._buf.find(CALL_END)
            if j < 0:
                if final:  # a call never closed: it stays text
                    content.append(self._buf)
                    self._buf = ""
                break
            body = self._buf[len(CALL_BEGIN) : j]
            call = _parse_call(body.strip())
            if call is None:
                content.append(self._buf[: j + len(CALL_END)])
            elif self.parallel or not self.called:
                calls.append({"index": self.called, **call})
                self.called += 1
            self._buf, self._in_call = self._buf[j + len(CALL_END) :], False
        return self._text("".join(content), final), calls

    def _text(self, text: str, final: bool) -> str:
        """Content as the whole-text parse gives it: whitespace next to a call is not content. Trailing
        whitespace is held until text follows (sent with it) or the end (sent only if nothing was called)."""
        body = text.rstrip()
        if not body:
            self._space += text
            if final and not self.called:
                text, self._space = self._space, ""
                return text
            return ""
        held = self._space if self.sent_text or not self.called else ""
        self._space = text[len(body):]
        if not self.sent_text and self.called:
            body = body.lstrip()
        self.sent_text = True
        return held + body


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (it may be the start of a call)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
