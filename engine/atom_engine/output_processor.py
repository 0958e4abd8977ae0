"""What a request's tokens mean to its client: stop conditions, stream text and logprob slices. Pure Python.

The batcher hands each new token here (:meth:`OutputProcessor.stop`: does the request end with it, and why) and
each step's tokens per request (:meth:`OutputProcessor.emit`), and gets back an immutable :class:`StepOutput`
the server streams: the tokens, the text they add (the request's :class:`IncrementalDetokenizer`, beside this
module), their logprobs, and at the end the finish and stop reason, the final text and the prompt logprobs. The
server never reads a :class:`Sequence`: it is the engine thread's to change.

vLLM's split: the scheduler checks stop tokens and lengths, the detokenizer stop strings
(``vllm/v1/engine/detokenizer.py``, ``vllm/v1/core/sched/utils.py``); here both are one decision per token, so a
stop inside an accepted draft drops the tokens after it in the same step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from atom_engine.detokenizer import IncrementalDetokenizer
from atom_engine.sequence import FinishReason, Sequence, StepOutput


@dataclass(frozen=True)
class Stop:
    """Why a request ends with its newest token: the reason, vLLM's ``stop_reason`` (the stop token or string;
    None for EOS and length) and the final text (None without a tokenizer)."""

    reason: FinishReason
    stop_reason: int | str | None = None
    text: str | None = None


class OutputProcessor:
    def __init__(self, detokenize: Callable[[list[int]], str] | None, eos_token_id: int | None) -> None:
        self.detokenize = detokenize
        self.eos_token_id = eos_token_id
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._sent_prompt_logprobs: set[str] = set()

    def add(self, seq: Sequence) -> None:
        """Start a request's text (with a tokenizer)."""
        if self.detokenize is not None:
            # A stream never sends the last characters a stop string may still cut.
            hold = max((len(s) for s in seq.params.stop), default=1) - 1
            self._detok[seq.id] = IncrementalDetokenizer(self.detokenize, seq.output, hold=hold)

    def stop(self, seq: Sequence, token: int) -> Stop | None:
        """``token`` was just appended to ``seq.output``: whether the request ends with it. Changes nothing but
        the request's own text."""
        det = self._detok.get(seq.id)
        if det is not None:
            det.update()
        p = seq.params
        n = len(seq.output)
        eos = not p.ignore_eos and token == self.eos_token_id
        if n >= p.min_tokens and (eos or token in p.stop_token_ids):  # vLLM: no stop before min_tokens
            # vLLM's rule: the stop token stays in token_ids but its text is not in the output.
            text = None if det is None else det.text if p.include_stop_str_in_output else det.text_before_last
            return Stop(FinishReason.STOP, None if eos else token, text)
        if n > p.min_tokens and p.stop and det is not None:  # vLLM: stop strings past min_tokens
            hit = det.find(p.stop)
            if hit is not None:
                at, string = hit
                text = det.text
                return Stop(FinishReason.STOP, string,
                            text[: at + len(string)] if p.include_stop_str_in_output else text[:at])
        if n >= p.max_tokens:
            return Stop(FinishReason.LENGTH, None, None if det is None else det.text)
        return None

    def text(self, seq: Sequence) -> str | None:
        """The request's whole output text so far (None without a tokenizer)."""
        det = self._detok.get(seq.id)
        return None if det is None else det.text

    def emit(self, seq: Sequence, new: tuple[int, ...]) -> StepOutput:
        """The output of a step that gave ``seq`` the ``new`` tokens (the last ones of ``seq.output``); once
        ``seq`` has finished, the request's last output, after which its state here is dropped."""
        det = self._detok.get(seq.id)
        finished = seq.finished
        logprobs = ()
        if seq.params.logprobs is not None and new:
            end = len(seq.output)
            logprobs = tuple(seq.logprobs[end - len(new) : end])
        prompt_logprobs = None
        if seq.prompt_logprobs is not None and (new or finished) and seq.id not in self._sent_prompt_logprobs:
            self._sent_prompt_logprobs.add(seq.id)
            prompt_logprobs = tuple(seq.prompt_logprobs)
        if not finished:
            text = det.stream_delta() if det is not None else ""
            return StepOutput(seq.id, new, False, text=text, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                              cached_tokens=seq.cached_tokens)
        final = seq.text
        text = det.stream_delta(final if final is not None else det.text) if det is not None else ""
        self._detok.pop(seq.id, None)
        self._sent_prompt_logprobs.discard(seq.id)
        return StepOutput(seq.id, new, True, seq.finish_reason, seq.error, text, seq.failure, logprobs=logprobs,
                          prompt_logprobs=prompt_logprobs, cached_tokens=seq.cached_tokens,
                          stop_reason=seq.stop_reason, final_text=final)
