"""A request as the batcher sees it: its tokens, sampling parameters, state and outcome. Pure Python."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings. ``temperature == 0`` is greedy."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1; got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0; got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it); got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class RequestRejected(ValueError):
    """The request can never be served as asked (an HTTP 400)."""


class QueueFull(RuntimeError):
    """The waiting queue is at maxWaiting (an HTTP 429)."""


class Status(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"  # holds a lane; prompt KV not complete yet
    DECODE = "decode"
    FINISHED = "finished"


@dataclass
class Sequence:
    id: str
    prompt: list[int]
    params: SamplingParams
    output: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    lane: int | None = None
    block: int | None = None
    computed: int = 0  # tokens whose KV is in the block (positions 0 .. computed-1)
    cached_tokens: int = 0  # of them, copied from the prefix cache
    finish_reason: str | None = None  # "stop", "length", "cancelled", "error"
    error: str | None = None
    stop_text: str | None = None  # the text up to (excluding) a matched stop string
    cancel_requested: bool = False
    sampler_state: Any = None  # owned by the runner (e.g. a seeded torch.Generator); the batcher never reads it

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


@dataclass(frozen=True)
class StepOutput:
    """What one step did for one request: the tokens it produced, and the outcome if it ended."""

    request_id: str
    new_tokens: tuple[int, ...]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
