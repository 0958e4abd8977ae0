"""OpenAI's Responses API, ``POST /v1/responses``, on the chat machinery: a request's ``instructions`` and
``input`` (text, or items: messages, ``function_call``, ``function_call_output``) become chat messages; ``tools``,
``tool_choice`` and ``text.format`` become the chat request's tools and structured output; the output becomes
``output`` items (a ``message`` with ``output_text``, ``function_call`` items), whole or as the typed SSE events
(``response.created`` ... ``response.completed``).

Responses with ``store`` (OpenAI's default: true) are kept in memory so that a later request can continue them
with ``previous_response_id``: the last :data:`KEPT` of them on this replica, least recently used first out,
gone at a restart (a follow-up sent to another replica, or after that, is a 400 naming the id). ``store: false``
keeps nothing. ``GET /v1/responses/{id}`` returns a kept response.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from atom_engine.server.error_responses import ApiError
from atom_engine.server.fields import check_extra

KEPT = 256  # responses kept for previous_response_id (each: its conversation's messages, its body)

# Responses fields -> the chat request's, and back for error messages.
CHAT_PARAM = {"messages": "input", "response_format": "text", "max_tokens": "max_output_tokens",
              "max_completion_tokens": "max_output_tokens"}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: StrictBool = False
    store: StrictBool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled"] | None = None  # "auto" (drop input to fit) is not implemented: refused
    reasoning: dict[str, Any] | None = None  # only empty / effort null: no model here reasons
    include: list[str] | None = None
    background: StrictBool = False
    max_tool_calls: StrictInt | None = None
    top_logprobs: StrictInt | None = None

    def check(self) -> None:
        extra = self.model_extra or {}
        for name, why in UNKEPT.items():
            if extra.get(name) is not None:
                raise ApiError(400, f"{name}: not supported by this engine: {why}", param=name,
                               code="unsupported_parameter")
        check_extra({k: v for k, v in extra.items()
                     if k not in RESPONSES_IGNORED and k not in UNKEPT and k not in SAMPLING_EXTENSIONS})
        if self.reasoning and any(v is not None for v in self.reasoning.values()):
            raise _bad("reasoning", "reasoning: this model does not reason; leave it out")
        for name, neutral in (("include", []), ("background", False), ("max_tool_calls", None),
                              ("top_logprobs", None)):
            value = getattr(self, name)
            if value is not None and value != neutral and value != 0:
                raise ApiError(400, f"{name}: not supported by this engine; got {value!r}", param=name,
                               code="unsupported_parameter")
        if isinstance(self.input, list) and not self.input:
            raise _bad("input", "input: at least one item")

    def chat_body(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The equivalent chat completion request (a dict, parsed and checked as any chat request)."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        messages += history + input_messages(self.input)
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.tools:
            body["tools"] = [chat_tool(t, i) for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            body["tool_choice"] = chat_tool_choice(self.tool_choice)
        if self.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = self.parallel_tool_calls
        fmt = (self.text or {}).get("format")
        if fmt is not None:
            body["response_format"] = chat_format(fmt)
        for ours, theirs in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                             ("top_p", "top_p")):
            if (value := getattr(self, ours)) is not None:
                body[theirs] = value
        body.update({k: v for k, v in (self.model_extra or {}).items() if k in SAMPLING_EXTENSIONS})
        return body


# The chat route's sampling fields that OpenAI's Responses API lacks, taken here as vLLM's Responses endpoint takes
# its sampling extensions: passed on to the chat request, which checks them (a seeded or biased agent turn samples
# as the same chat request would). Every other unknown field is ignored, as on the chat route.
SAMPLING_EXTENSIONS = frozenset({"seed", "top_k", "logit_bias", "repetition_penalty", "presence_penalty",
                                 "frequency_penalty"})
# Responses fields that never change the output (beyond the chat ones in atom_engine.server.fields).
RESPONSES_IGNORED = frozenset({"stream_options", "prompt_cache_retention"})
# Responses fields that bring in input kept on OpenAI's side, which this engine does not have: ignoring one would
# answer a different question than the client asked (refused unless null; only here, as the chat route has no
# such fields and its unknown ones stay vLLM's).
UNKEPT = {"conversation": "it keeps no conversations; continue a kept response with previous_response_id or send"
                          " the whole conversation as input",
          "prompt": "it keeps no prompt templates; send the prompt as instructions and input"}


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as chat messages: a function call becomes an assistant's tool call (consecutive calls one
    message), its output a tool message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad("input", f"input[{i}].role: one of user, system, developer, assistant; got {role!r}")
            out.append({"role": role, "content": item.get("content")})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise _bad("input", f"input[{i}]: a function_call has string call_id, name and arguments")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or not isinstance(output, str | list):
                raise _bad("input", f"input[{i}]: a function_call_output has a string call_id and an output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        else:
            raise _bad("input", f"input[{i}].type: {kind!r} items are not supported by this engine (it takes"
                       " message, function_call and function_call_output)")
    return out


def chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise _bad("tools", f"tools[{i}].type: only function tools run here; got {tool.get('type')!r}")
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise _bad("tool_choice", f"tool_choice: 'auto', 'none', 'required' or {{'type': 'function', 'name':"
                       f" ...}}; got {choice!r}")
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def chat_format(fmt: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise _bad("text", f"text.format.type: one of 'text', 'json_object', 'json_schema'; got {fmt!r}")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}


def renamed(exc: ApiError, before: int = 0) -> ApiError:
    """A chat request's error in the Responses API's names; ``before``: the chat messages ahead of the input's
    (instructions, a kept conversation), so ``messages[i]`` is named as ``input[i - before]``."""
    param = CHAT_PARAM.get(exc.param or "", exc.param)
    message = exc.message
    at = re.match(r"messages\[(\d+)\]", message)
    if at is not None and int(at.group(1)) >= before:
        message = f"input[{int(at.group(1)) - before}]" + message[at.end():]
    elif at is not None:
        message = "previous_response_id's conversation: " + message
    else:
        for theirs, ours in CHAT_PARAM.items():
            if message.startswith(theirs):
                message = ours + message[len(theirs):]
                break
    return ApiError(exc.status, message, param=param, code=exc.code, err_type=exc.err_type)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class Kept:
    messages: list[dict[str, Any]]  # the conversation so far, as chat messages (without instructions)
    body: dict[str, Any]


@dataclass
class ResponseStore:
    """The responses kept for ``previous_response_id``: an LRU of :data:`KEPT`."""

    limit: int = KEPT
    _items: OrderedDict[str, Kept] = field(default_factory=OrderedDict)

    def get(self, rid: str) -> Kept | None:
        kept = self._items.get(rid)
        if kept is not None:
            self._items.move_to_end(rid)
        return kept

    def put(self, rid: str, kept: Kept) -> None:
        self._items[rid] = kept
        while len(self._items) > self.limit:
            self._items.popitem(last=False)


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" \
        else []
    return {"type": "message", "id": item_id or new_id("msg"), "status": status, "role": "assistant",
            "content": content}


def call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    fn = call["function"]
    return {"type": "function_call", "id": new_id("fc"), "call_id": call["id"], "name": fn["name"],
            "arguments": fn["arguments"] if status == "completed" else "", "status": status}


def response_body(rid: str, req: ResponsesRequest, created: int, output: list[dict[str, Any]], status: str,
                  usage: dict[str, Any] | None, incomplete: str | None = None) -> dict[str, Any]:
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": req.model,
        "output": output, "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": req.instructions, "metadata": req.metadata or {},
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto", "tools": req.tools or [],
        "text": req.text or {"format": {"type": "text"}}, "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id, "store": req.store, "truncation": "disabled",
        "reasoning": {"effort": None, "summary": None}, "user": req.user, "background": False,
        "usage": usage, "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
    }


def usage_of(prompt_tokens: int, output_tokens: int, cached: int) -> dict[str, Any]:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens}


def assistant_message(content: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The output as the next turn's chat history."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{k: c[k] for k in ("id", "type", "function")} for c in calls]
    return message
