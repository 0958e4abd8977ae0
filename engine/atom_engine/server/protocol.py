"""Request bodies of the OpenAI routes and vLLM's /tokenize and /detokenize, checked strictly (a 400 names the field).

Field names, defaults and bounds follow vLLM's OpenAI server (``vllm/entrypoints/openai/completion/protocol.py``,
``chat_completion/protocol.py``, ``serve/tokenize/protocol.py``), so its clients (lm-eval, guidellm) work as is.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from atom_engine.sequence import MAX_LOGPROBS, SamplingParams
from atom_engine.server.error_responses import ApiError
from atom_engine.server.fields import check_extra
from atom_engine.server.structured import spec_of
from atom_engine.server.tools import ToolRequest, tool_request
from atom_engine.structured.spec import GrammarSpec

INT64 = 2**63
MAX_N = 128  # choices per request (each prompt); the waiting queue (maxWaiting) bounds them further
MAX_PROMPTS = 1024  # prompts per request, as vLLM's VLLM_MAX_COMPLETION_PROMPTS default


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: StrictBool = False  # a last chunk with the usage of the whole request
    continuous_usage_stats: StrictBool = False  # vLLM's: every chunk carries the usage so far


class SamplingRequest(BaseModel):
    """The fields completions and chat share: the model, sampling and stopping."""

    # Unknown fields are kept aside (model_extra) and sorted by atom_engine.server.fields: ignored as vLLM does,
    # or refused where they would change the answer.
    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(None, ge=-1)  # vLLM's extension; -1 or 0: off
    seed: StrictInt | None = Field(None, ge=-INT64, lt=INT64)
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None  # vLLM's extension: stop tokens, their text not in the output
    ignore_eos: StrictBool = False  # vLLM's extension
    include_stop_str_in_output: StrictBool = False  # vLLM's extension
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    # Structured outputs (atom_engine.server.structured): OpenAI's, and vLLM's extensions
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    min_tokens: StrictInt = Field(0, ge=0)  # vLLM's extension
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)  # vLLM's extension
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    n: StrictInt = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    return_token_ids: StrictBool = False  # vLLM's extension: token ids in each choice
    return_tokens_as_token_ids: StrictBool = False  # vLLM's extension: logprob tokens as "token_id:<id>"
    user: str | None = None

    def check(self) -> None:
        """Rules across fields (a 400 naming the field)."""
        check_extra(self.model_extra)
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options: only allowed with stream=true", param="stream_options",
                           code="invalid_value")
        if self.min_tokens > self.max_tokens_or(self.min_tokens):
            raise ApiError(400, f"min_tokens: must be <= max_tokens ({self.max_tokens_or(0)}); got {self.min_tokens}",
                           param="min_tokens", code="invalid_value")
        bad = [t for t in self.stop_token_ids or () if t < 0]
        if bad:
            raise ApiError(400, f"stop_token_ids: token ids must be >= 0; got {bad[:5]}", param="stop_token_ids",
                           code="invalid_value")
        self.grammar()  # a 400 for a malformed grammar field (its source is checked when compiled)
        for key, bias in (self.logit_bias or {}).items():
            if not key.isdigit() or not -100 <= bias <= 100:
                raise ApiError(400, f"logit_bias: keys must be token ids and values in [-100, 100]; got {key!r}:"
                               f" {bias}", param="logit_bias", code="invalid_value")

    def check_vocab(self, vocab: int) -> None:
        """Token ids named by the request must exist in the model's vocabulary (vLLM refuses them too)."""
        bad = [int(k) for k in self.logit_bias or {} if int(k) >= vocab]
        if bad:
            raise ApiError(400, f"logit_bias: token ids must be < {vocab}; got {bad[:5]}", param="logit_bias",
                           code="invalid_value")

    def max_tokens_or(self, default: int) -> int:
        return self.max_tokens if self.max_tokens is not None else default

    def grammar(self) -> tuple[str, GrammarSpec] | None:
        """The structured output asked for, and the field that asked."""
        return spec_of({name: getattr(self, name) for name in (
            "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
            "guided_grammar", "ignore_eos", "min_tokens")})

    def sampling(self, max_tokens: int, **extra: Any) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=max(self.top_k or 0, 0), top_p=1.0 if self.top_p is None else self.top_p, seed=self.seed,
            stop=tuple(s for s in stop if s), stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items()),
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            **extra,
        )


class CompletionRequest(SamplingRequest):
    # A string, a list of strings, a list of token ids, or a list of token-id lists: one choice (n) per prompt.
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    max_tokens: StrictInt | None = Field(None, ge=0)  # 0 only with echo: the prompt scored, nothing generated
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM's extension
    suffix: str | None = None  # refused, as vLLM does

    @field_validator("prompt")
    @classmethod
    def _prompt_count(cls, v: Any) -> Any:
        if isinstance(v, list) and v and not isinstance(v[0], int) and len(v) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request; got {len(v)}")
        if isinstance(v, list) and not v:
            raise ValueError("the prompt is empty; it needs at least one token")
        return v

    def check(self) -> None:
        super().check()
        if self.suffix is not None:
            raise ApiError(400, "suffix: not supported by this engine (as vLLM)", param="suffix",
                           code="invalid_value")
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(400, "max_tokens: must be >= 1 (0 only with echo=true); got 0", param="max_tokens",
                           code="invalid_value")
        if self.prompt_logprobs is not None and self.stream:
            raise ApiError(400, "prompt_logprobs: not available with stream=true", param="prompt_logprobs",
                           code="invalid_value")

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]

    @property
    def echo_only(self) -> bool:
        """vLLM's echo with max_tokens 0: one token is generated, only the prompt is returned."""
        return self.echo and self.max_tokens == 0

    def completion_sampling(self, default_max_tokens: int) -> SamplingParams:
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs is None and self.echo:
            prompt_logprobs = self.logprobs  # vLLM: echo with logprobs scores the prompt too
        return self.sampling(1 if self.echo_only else self.max_tokens_or(default_max_tokens),
                             logprobs=self.logprobs, prompt_logprobs=prompt_logprobs)


# Content parts a text-only model can take (their text is the message's), and the ones it cannot: refused, since
# dropping an image and answering as if there were none is a wrong answer.
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
MEDIA_PARTS = {"image_url": "images", "input_image": "images", "image": "images", "image_pil": "images",
               "input_audio": "audio", "audio_url": "audio", "video_url": "video", "file": "files",
               "input_file": "files"}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls (arguments: a JSON string)
    tool_call_id: str | None = None  # a tool message's: the call it answers

    def check(self, where: str) -> None:
        """Every content part is text (a 400 naming the first that is not)."""
        for j, part in enumerate(self.content if isinstance(self.content, list) else ()):
            kind = part.get("type")
            if kind in MEDIA_PARTS:
                raise ApiError(400, f"{where}.content[{j}]: a {kind!r} content part needs a model that takes"
                               f" {MEDIA_PARTS[kind]}; this model takes text only", param="messages",
                               code="unsupported_content")
            key = TEXT_PARTS.get(kind) if isinstance(kind, str) else None
            if key is None:
                raise ApiError(400, f"{where}.content[{j}]: unknown content part type {kind!r}; expected one of"
                               f" {sorted(TEXT_PARTS)}", param="messages", code="invalid_value")
            if not isinstance(part.get(key), str):
                raise ApiError(400, f"{where}.content[{j}]: a {kind!r} part needs a string {key!r}",
                               param="messages", code="invalid_value")
        check_extra({k: v for k, v in (self.model_extra or {}).items() if k in MESSAGE_FIELDS_REFUSED})
        for j, call in enumerate(self.tool_calls or ()):
            fn = call.get("function")
            args = fn.get("arguments") if isinstance(fn, dict) else None
            try:
                ok = isinstance(fn.get("name"), str) and isinstance(json.loads(args), dict)  # type: ignore[union-attr]
            except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deep to parse
                ok = False
            if self.role != "assistant" or not ok:
                raise ApiError(400, f"{where}.tool_calls[{j}]: an assistant's call is {{'id': ..., 'type': 'function',"
                               " 'function': {'name': ..., 'arguments': '<a JSON object>'}}", param="messages",
                               code="invalid_value")

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p[TEXT_PARTS[p["type"]]] for p in self.content)
        return self.content or ""

    def template_dict(self) -> dict[str, Any]:
        """The message as a chat template sees it (transformers passes the message dicts as given)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:  # arguments as an object, as vLLM hands them to templates (they write them as JSON)
            out["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
                c["function"]["arguments"])}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


# A message's fields that carry what the prompt would lose if ignored.
MESSAGE_FIELDS_REFUSED = frozenset({"audio", "function_call"})


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None  # atom_engine.server.tools
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None

    def check(self) -> None:
        super().check()
        for i, m in enumerate(self.messages):
            m.check(f"messages[{i}]")
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs: needs logprobs=true", param="top_logprobs", code="invalid_value")
        self.tool_request()  # a 400 naming the field for malformed tools (a format goes with any tool_choice)

    def tool_request(self) -> ToolRequest | None:
        return tool_request(self.tools, self.tool_choice, self.parallel_tool_calls)

    @property
    def history_calls(self) -> bool:
        """The conversation holds tool calls or their results (the template must render them)."""
        return any(m.tool_calls or m.role == "tool" for m in self.messages)

    def max_tokens_or(self, default: int) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        return self.max_completion_tokens if self.max_completion_tokens is not None else default

    def chat_sampling(self, default_max_tokens: int) -> SamplingParams:
        return self.sampling(self.max_tokens_or(default_max_tokens),
                             logprobs=(self.top_logprobs or 0) if self.logprobs else None)


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a ``prompt`` (TokenizeCompletionRequest) or chat ``messages`` (TokenizeChatRequest)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Any] | None = None  # vLLM's: rendered by the chat template, as the chat route does
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ApiError(400, "prompt: give exactly one of prompt or messages", param="prompt",
                           code="invalid_value")
        for i, m in enumerate(self.messages or ()):
            m.check(f"messages[{i}]")


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    tokens: list[StrictInt]


def parse(model: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        param = str(err["loc"][0]) if err["loc"] else None  # the top-level field, as OpenAI reports it
        raise ApiError(400, f"{where}: {err['msg']}" if where else err["msg"], param=param,
                       code="invalid_value") from None
