"""A request as the batcher sees it: its tokens, sampling parameters, state and outcome. Pure Python."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from atom_engine.speculation import Drafter

MAX_LOGPROBS = 20  # vLLM's default max_logprobs (and OpenAI's bound on top_logprobs)


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
    include_stop_str_in_output: bool = False  # vLLM's: keep the matched stop string (or stop token's text)
    logit_bias: tuple[tuple[int, float], ...] = ()  # OpenAI's: added to the token's logit before sampling
    min_tokens: int = 0  # no stop (EOS, stop token, stop string) before this many output tokens
    # vLLM's penalties: repetition (HF's rule) over prompt and output tokens; presence and frequency over output.
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # per output token: its logprob, rank and the top-N (0: only the token's own)
    prompt_logprobs: int | None = None  # the same per prompt token (the first has none)
    # A compiled grammar (atom_engine.structured.compiler.Grammar): the sampler masks every token it forbids.
    grammar: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1; got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0; got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it); got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}]; got {self.min_tokens}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2]; got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2]; got {getattr(self, name)}")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not 0 <= n <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}]; got {n}")
        bad = [(t, b) for t, b in self.logit_bias if not -100 <= b <= 100]
        if bad:
            raise ValueError(f"logit_bias values must be in [-100, 100]; got {bad[:3]}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "logit_bias", tuple(self.logit_bias))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def shapes_logits(self) -> bool:
        """The logits are changed before sampling (bias, penalties, min_tokens, a grammar): not a plain argmax."""
        return (self.min_tokens > 0 or self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0 or bool(self.logit_bias) or self.grammar is not None)

    @property
    def plain_greedy(self) -> bool:
        """An argmax of the raw logits is the whole job: the batched fast path of a decode step."""
        return self.greedy and not self.shapes_logits and self.logprobs is None

    @property
    def takes_drafts(self) -> bool:
        """The next token is the argmax of the raw logits, or of the logits the request's grammar masks: a
        prompt-lookup draft can be checked against it (atom_engine.sampling.verify_draft)."""
        return self.plain_greedy or (self.greedy and self.logprobs is None and self.grammar is not None and not (
            self.min_tokens > 0 or self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0 or self.logit_bias))


@dataclass(frozen=True)
class TokenLogprob:
    """One position's token with its logprob under the raw model distribution (as vLLM's default
    ``raw_logprobs``: before penalties, temperature and top-k/p), its rank (1: the most likely) and the
    ``top`` most likely tokens with theirs, best first."""

    token: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


class FinishReason(enum.StrEnum):
    """Why a request ended (OpenAI's ``finish_reason``, plus vLLM-style "cancelled" and "error")."""

    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens
    CANCELLED = "cancelled"  # the client left
    ERROR = "error"  # the request failed: Sequence.failure says why


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
    finish_reason: FinishReason | None = None
    error: str | None = None  # "<exception type>: <message>" of failure
    failure: Exception | None = None  # what ended the request with FinishReason.ERROR
    stop_text: str | None = None  # the text up to (excluding) a matched stop string or stop token
    stop_reason: int | str | None = None  # vLLM's: the stop token id or stop string that ended it (not EOS)
    eos_token_id: int | None = None  # the model's, for min_tokens (set by the batcher)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, when asked
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token (None first), when asked
    sampler_state: Any = None  # owned by the sampler (sampling.SeededDraws); the batcher never reads it
    text: str | None = None  # the final output text, set when the request ends (with a tokenizer)
    output_done: bool = False  # its last StepOutput was made
    drafter: Drafter | None = None  # the batcher's drafts for this request (greedy, with speculation)
    constraint: Any = None  # the grammar's state for this request (structured outputs), owned by the sampler
    decode_began: float | None = None  # the batcher's clock at its first token (its prompt's KV complete)
    arrived_at: float = 0.0  # the batcher's clock when it was queued
    admitted_at: float | None = None  # the batcher's clock when it took a lane

    @property
    def tokens(self) -> list[int]:
        """Prompt and output as one new list (a copy: for a request's end, never per step)."""
        return self.prompt + self.output

    @property
    def last_token(self) -> int:
        """The token a decode step feeds (no copy of the sequence)."""
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def cacheable_prompt(self) -> list[int]:
        """The prompt to look up in the prefix cache; nothing for prompt logprobs, which need every prompt
        token's logits (vLLM computes them again too)."""
        return [] if self.params.prompt_logprobs is not None else self.prompt

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


@dataclass(frozen=True)
class StepOutput:
    """What one step did for one request: the tokens it produced, and the outcome if it ended. Immutable: what
    the server reads of a request is this, never its :class:`Sequence`."""

    request_id: str
    new_tokens: tuple[int, ...]
    finished: bool
    finish_reason: FinishReason | None = None
    error: str | None = None
    text: str = ""  # the output text this step adds to a stream (see atom_engine.output_processor)
    failure: Exception | None = None  # the exception behind FinishReason.ERROR (typed, for the server's status)
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token, when the request asked for them
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # once, with the first tokens (when asked)
    cached_tokens: int = 0  # prompt tokens copied from the prefix cache
    stop_reason: int | str | None = None  # at the end: vLLM's stop_reason (the stop token or string)
    final_text: str | None = None  # at the end: the whole output text (with a tokenizer)
