"""Request bodies of /v1/completions and /v1/chat/completions, checked strictly (wrong types are a 400)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from atom_engine.sequence import SamplingParams
from atom_engine.server.errors import ApiError


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Common(BaseModel):
    # Unknown fields are ignored as OpenAI-compatible servers do; the ones we cannot honour are refused below.
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(-1, ge=-1)  # vLLM's extension; -1 or 0: off
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None  # vLLM's extension
    ignore_eos: StrictBool = False  # vLLM's extension
    n: StrictInt = Field(1, ge=1, le=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    return_token_ids: StrictBool = False  # vLLM's extension: token ids in each choice
    logprobs: Any = None
    user: str | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: Any) -> Any:
        if v not in (None, False):
            raise ValueError("logprobs are not supported by this engine")
        return v

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_tokens or self.max_completion_tokens or default_max_tokens,
            temperature=self.temperature, top_k=max(self.top_k, 0), top_p=self.top_p, seed=self.seed,
            stop=tuple(s for s in stop if s), stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(_Common):
    prompt: str | list[StrictInt] | list[str]
    echo: StrictBool = False

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported by this engine")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)


def parse(model: type[_Common], body: Any) -> Any:
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
