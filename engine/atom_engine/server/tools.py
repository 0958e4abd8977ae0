"""Tool calling: a request's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` checked, the grammar that
enforces ``required`` and a named function (and lets a tool be called under ``auto`` with a format), and the
model's tool calls parsed out of its whole text (a stream's: :mod:`atom_engine.server.tool_stream`).

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
# A call's beginning in the Hermes format, up to its arguments (the name's JSON escapes kept).
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


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

    @property
    def forced(self) -> bool:
        """``required`` or a named function: the output is calls only."""
        return self.choice not in ("auto", "none")

    def calls_grammar(self) -> GrammarSpec:
        """Calls and nothing else: one call of a named function; else one or more calls (one unless
        ``parallel``) of the given tools, the arguments matching each tool's ``parameters`` schema."""
        named = self.choice in self.names
        tools = [t for t in self.tools if t["function"]["name"] == self.choice] if named else list(self.tools)
        tags = [{"type": "tag", "begin": f'{CALL_BEGIN}\n{{"name": "{t["function"]["name"]}", "arguments": ',
                 "content": {"type": "json_schema", "json_schema": t["function"]["parameters"],
                             "max_whitespace_cnt": 1},
                 "end": f"}}\n{CALL_END}"} for t in tools]
        fmt: dict[str, Any] = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
                               "stop_after_first": named or not self.parallel}
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
    tools the template renders, and the one grammar the turn samples under (with the field it answers to)."""

    parse: ToolRequest | None
    rendered: list[dict[str, Any]] | None
    grammar: tuple[str, GrammarSpec] | None


def chat_tools(req: ChatCompletionRequest, tool_format: str | None, model: str) -> ChatTools:
    tools = req.tool_request()
    check_template(tools, req.history_calls, tool_format, model)
    rendered = list(tools.tools) if tools is not None and tool_format is not None else None
    calls = tools if tools is not None and tools.calls else None
    return ChatTools(calls, rendered, turn_grammar(calls, req.grammar()))


def turn_grammar(tools: ToolRequest | None, answer: tuple[str, GrammarSpec] | None
                 ) -> tuple[str, GrammarSpec] | None:
    """The grammar of one turn of a request with tools that may be called (``tools``) and an answer format
    (``answer``: the field and its grammar), as agents send them: the format is for the answer, the turn that
    follows the calls.

    - A forced call (``required``, a named function): the turn is calls only, under the calls' grammar; the
      format applies to the answering turn, which the client sends without forcing a call.
    - ``auto`` with a format: the calls or the formatted answer (a union of both grammars), so the model may
      still call a tool.
    - ``auto`` alone: free text (as vLLM); no tools to call: the format's grammar, if any."""
    if tools is None:
        return answer
    if tools.forced:
        return "tool_choice", tools.calls_grammar()
    if answer is None:
        return None
    return answer[0], GrammarSpec.any_of(tools.calls_grammar(), answer[1])


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


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ObjectEnd:
    """Where a JSON object written out piece by piece ends: its braces and brackets counted outside strings. Fed
    the text from the object's ``{`` on, each piece once."""

    def __init__(self) -> None:
        self.depth = 0
        self._string = False
        self._escape = False

    def feed(self, text: str) -> int | None:
        """The index in ``text`` just past the object's last ``}``; None while it goes on."""
        for i, ch in enumerate(text):
            if self._string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._string = False
            elif ch == '"':
                self._string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None


def call_header(body: str) -> tuple[str, int] | None:
    """A call's name and where its arguments begin, when ``body`` (the text after ``<tool_call>``) starts as the
    Hermes format writes a call, ``{"name": "...", "arguments": {``; None otherwise (or not yet)."""
    m = _HEADER.match(body)
    if m is None or body[m.end() : m.end() + 1] != "{":
        return None
    try:
        name = json.loads(f'"{m.group(1)}"')
    except ValueError:
        return None
    return name, m.end()


def parse_call(body: str) -> dict[str, Any] | None:
    """One call's JSON to OpenAI's ``tool_calls`` entry; None if malformed. ``arguments`` is the object as the
    model wrote it, which is what a stream sends piece by piece (:mod:`atom_engine.server.tool_stream`); a call
    in another shape (its keys in another order, vLLM's ``parameters``) has its arguments re-serialized."""
    header = call_header(body)
    if header is not None:
        name, at = header
        end = ObjectEnd().feed(body[at:])
        if end is not None and re.fullmatch(r"\s*\}\s*", body[at + end :]) and _an_object(body[at : at + end]):
            return {"id": call_id(), "type": "function", "function": {"name": name, "arguments": body[at : at + end]}}
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": call_id(), "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def _an_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def parse_tool_calls(text: str, parallel: bool = True) -> tuple[str | None, list[dict[str, Any]]]:
    """The content outside the calls (None when only calls) and the calls. A malformed call stays content.
    ``parallel`` false (``parallel_tool_calls: false``): at most one call, the first; the model's further calls
    are dropped, neither calls nor content (under ``auto`` the grammar leaves the text free, so only the parse
    can keep OpenAI's promise of one call)."""
    calls: list[dict[str, Any]] = []
    content: list[str] = []
    at = 0
    for m in _CALL.finditer(text):
        call = parse_call(m.group(1))
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
