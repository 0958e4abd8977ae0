"""What a request's tokens mean to its client: stop conditions, stream text and logprob slices. Pure Python.

The batcher asks here whether a new token ends its request by its id (:meth:`OutputProcessor.token_stop`: EOS, a
stop token, max_tokens) when it applies a step, and later, when the step's outputs are made (possibly while the
device runs the next step), takes each token into the request's text (:meth:`OutputProcessor.text_stop`: stop
strings, the final text) and makes the immutable :class:`StepOutput` the server streams
(:meth:`OutputProcessor.emit`): the tokens, the text they add (the request's :class:`IncrementalDetokenizer`,
beside this module), their logprobs, and at the end the finish and stop reason, the final text and the prompt
logprobs. The server never reads a :class:`Sequence`: it is the engine thread's to change.

vLLM's split: the scheduler checks stop tokens and lengths, the detokenizer stop strings
(``vllm/v1/engine/detokenizer.py``, ``vllm/v1/core/sched/utils.py``); a stop string inside an accepted draft
drops the tokens after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from atom_engine.detokenizer import IncrementalDetokenizer
from atom_engine.sequence import FinishReason, Sequence, StepOutput


@dataclass(frozen=True)
class Stop:
    """Why a request ends with a token: the reason, vLLM's ``stop_reason`` (the stop token or string; None for EOS
    and length) and the final text (None without a tokenizer)."""

    reason: FinishReason
    stop_reason: int | str | None = None
    text: str | None = None


class Pending(NamedTuple):
    """A step's news for one request, to be made into its output: a token (or none: the request was cancelled
    or failed) at ``seq.output[at]``; ``finishing``: the batcher ended the request with it (a stop token, EOS,
    max_tokens, a failure, a cancel). A tuple: one is made per lane and step, between two forwards."""

    seq: Sequence
    tokens: tuple[int, ...]
    at: int
    finishing: bool


class OutputProcessor:
    def __init__(self, detokenize: Callable[[list[int]], str] | None, eos_token_id: int | None) -> None:
        self.detokenize = detokenize
        self.eos_token_id = eos_token_id
        self._detok: dict[str, tuple[IncrementalDetokenizer, list[int]]] = {}
        self._sent_prompt_logprobs: set[str] = set()

    def add(self, seq: Sequence) -> None:
        """Start a request's text (with a tokenizer)."""
        if self.detokenize is not None:
            # A stream never sends the last characters a stop string may still cut.
            hold = max((len(s) for s in seq.params.stop), default=1) - 1
            tokens: list[int] = []  # the tokens taken in so far: the batcher's output may be a step ahead
            self._detok[seq.id] = (IncrementalDetokenizer(self.detokenize, tokens, hold=hold), tokens)

    def token_stop(self, seq: Sequence, token: int) -> tuple[FinishReason, int | None] | None:
        """Whether ``token``, just appended to ``seq.output``, ends the request by its id alone (EOS, a stop token,
        max_tokens), with vLLM's stop_reason; the text's own stops (stop strings) are :meth:`text_stop`'s."""
        p = seq.params
        n = len(seq.output)
        eos = not p.ignore_eos and token == self.eos_token_id
        if n >= p.min_tokens and (eos or token in p.stop_token_ids):  # vLLM: no stop before min_tokens
            return FinishReason.STOP, None if eos else token
        if n >= p.max_tokens:
            return FinishReason.LENGTH, None
        return None

    def text_stop(self, seq: Sequence, token: int, at: int, ended: tuple[FinishReason, int | None] | None
                  ) -> Stop | None:
        """Take ``token`` (``seq.output[at]``) into the request's text: whether the request ends with it, and its
        final text. ``ended``: :meth:`token_stop`'s answer for it. Changes nothing but the request's own text."""
        det = self._take(seq, token)
        p = seq.params
        if ended is not None and ended[0] is FinishReason.STOP:
            # vLLM's rule: the stop token stays in token_ids but its text is not in the output.
            text = None if det is None else det.text if p.include_stop_str_in_output else det.text_before_last
            return Stop(FinishReason.STOP, ended[1], text)
        if at + 1 > p.min_tokens and p.stop and det is not None:  # vLLM: stop strings past min_tokens
            hit = det.find(p.stop)
            if hit is not None:
                i, string = hit
                text = det.text
                return Stop(FinishReason.STOP, string, text[: i + len(string)] if p.include_stop_str_in_output
                            else text[:i])
        if ended is not None:
            return Stop(ended[0], ended[1], None if det is None else det.text)
        return None

    def _take(self, seq: Sequence, token: int) -> IncrementalDetokenizer | None:
        held = self._detok.get(seq.id)
        if held is None:
            return None
        det, tokens = held
        tokens.append(token)
        det.update()
        return det

    def text(self, seq: Sequence) -> str | None:
        """The request's output text taken in so far (None without a tokenizer)."""
        held = self._detok.get(seq.id)
        return None if held is None else held[0].text

    def emit(self, seq: Sequence, tokens: tuple[int, ...], at: int, final: bool) -> StepOutput:
        """The output that gives ``seq`` the ``tokens`` (``seq.output[at:]``); ``final``: its last output, with
        the outcome already on ``seq``, after which its state here is dropped."""
        held = self._detok.get(seq.id)
        det = None if held is None else held[0]
        logprobs = ()
        if seq.params.logprobs is not None and tokens:
            logprobs = tuple(seq.logprobs[at : at + len(tokens)])
        prompt_logprobs = None
        if seq.prompt_logprobs is not None and (tokens or final) and seq.id not in self._sent_prompt_logprobs:
            self._sent_prompt_logprobs.add(seq.id)
            prompt_logprobs = tuple(seq.prompt_logprobs)
        if not final:
            text = det.stream_delta() if det is not None else ""
            return StepOutput(seq.id, tokens, False, text=text, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                              cached_tokens=seq.cached_tokens)
        final_text = seq.text
        text = det.stream_delta(final_text if final_text is not None else det.text) if det is not None else ""
        self._detok.pop(seq.id, None)
        self._sent_prompt_logprobs.discard(seq.id)
        return StepOutput(seq.id, tokens, True, seq.finish_reason, seq.error, text, seq.failure, logprobs=logprobs,
                          prompt_logprobs=prompt_logprobs, cached_tokens=seq.cached_tokens,
                          stop_reason=seq.stop_reason, final_text=final_text)
