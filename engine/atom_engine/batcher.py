"""The lane batcher: a waiting queue, ``lanes`` decode slots, continuous batching. Pure Python: no torch.

One :meth:`Batcher.step` (1) applies cancels, (2) fills free lanes from the queue (a lane freed in the last step
is refilled now, not at the end of a batch), (3) brings each lane still without its prompt's KV one step further:
one prefill chunk, or, with a KV connector (:mod:`atom_engine.kv_connector`: PD's remote prefill), the import of
a shipment that has arrived, and (4) runs one decode step over all lanes: one token per lane, or, with
``speculative_tokens``, a greedy lane's last token and its prompt-lookup draft (:mod:`atom_engine.speculation`),
of which it keeps what the model agrees with, so a lane may gain several tokens in one step. Where the runner
``mixes_prefill`` (the cpu backend), the prefill chunks of (3) ride in the forward of (4), as vLLM's chunked
prefill does: the weights are read once a step, not once more for every chunk; a lane so prefilled decodes from
the next step on. An exception while serving one request ends that request with an error; the batcher keeps
serving the others and every KV block stays accounted for.

The model is behind :class:`Runner`, so the batcher runs against a fake in tests and the torch runner in pods.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol

from atom_engine.detokenizer import IncrementalDetokenizer
from atom_engine.errors import ContextTooLong, QueueFull, RequestRejected
from atom_engine.kv_blocks import Allocation, KVBlocks
from atom_engine.kv_connector import KVConnector, LoadedKV
from atom_engine.sequence import FinishReason, SamplingParams, Sequence, Status, StepOutput
from atom_engine.speculation import Drafter

log = logging.getLogger(__name__)


class Runner(Protocol):
    """What the batcher needs from the model side. Implementations own all device tensors."""

    def prefill(self, seq: Sequence, start: int, tokens: list[int], last: bool) -> int | None:
        """Compute the KV of ``tokens`` at positions ``start..`` into ``seq.block``; if ``last``, sample and
        return the first output token."""

    def decode(self, batch: list[Sequence | None]) -> list[int | None]:
        """One decode step over all lanes (``None``: an empty lane, padded with the scratch block). Each
        sequence feeds its last token at position ``seq.computed``; returns the sampled token per lane."""

    def verify(self, batch: list[Sequence | None], drafts: list[list[int]]) -> list[list[int] | None]:
        """A decode step in which each lane also feeds its draft (greedy lanes only; others have none); returns
        per lane the draft tokens the model agrees with, then its own next token (see ModelRunner.verify)."""

    def mixed(self, batch: list[Sequence | None], drafts: list[list[int]],
              chunks: list[tuple[Sequence, int, list[int], bool]]) -> tuple[list[list[int] | None], list[int | None]]:
        """A verify step and prefill chunks ``(seq, start, tokens, last)`` in one forward (only where the runner
        says ``mixes_prefill``); returns verify's result and each chunk's first output token (None if not last)."""

    def copy_block(self, src: int, dst: int) -> None:
        """Copy a whole KV block (a prefix-cache hit)."""

    def load_kv(self, seq: Sequence, loaded: LoadedKV) -> int:
        """Import KV computed elsewhere into ``seq.block`` (positions ``loaded.start..``) and return the first
        output token, sampled from the shipped logits (only with a KV connector)."""


class Batcher:
    def __init__(
        self,
        runner: Runner,
        kv: KVBlocks,
        *,
        lanes: int,
        max_seq_len: int,
        prefill_chunk: int,
        max_waiting: int = 256,
        eos_token_id: int | None = None,
        detokenize: Callable[[list[int]], str] | None = None,
        connector: KVConnector | None = None,
        speculative_tokens: int = 0,
    ) -> None:
        """``connector``: where prompt KV comes from instead of local prefill (None: every prompt is prefilled
        here). ``speculative_tokens``: the longest draft a greedy lane feeds per decode step (0: none)."""
        self.runner = runner
        self.kv = kv
        self.lanes: list[Sequence | None] = [None] * lanes
        self.max_seq_len = max_seq_len
        self.prefill_chunk = prefill_chunk
        self.max_waiting = max_waiting
        self.eos_token_id = eos_token_id
        self.detokenize = detokenize
        self.connector = connector
        self.speculative_tokens = speculative_tokens
        self.waiting: deque[Sequence] = deque()
        self._lock = threading.Lock()  # add/cancel may come from another thread than step
        self._cancels: set[str] = set()
        self._ids = itertools.count()
        self.counters = {
            "prompt_tokens": 0, "generation_tokens": 0, "prefill_tokens_computed": 0, "cached_prompt_tokens": 0,
            "steps": 0, "decode_steps": 0, "prefill_chunks": 0, "requests_finished": 0, "requests_failed": 0,
            "requests_cancelled": 0, "draft_tokens": 0, "draft_tokens_accepted": 0,
        }

    # -- requests --------------------------------------------------------------------------------
    def add(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> Sequence:
        """Queue a request, or refuse it now if it can never fit. Thread-safe."""
        if not prompt:
            raise RequestRejected("the prompt is empty; it needs at least one token")
        if len(prompt) + params.max_tokens > self.max_seq_len:
            raise ContextTooLong(
                f"maximum context length is {self.max_seq_len} tokens; the prompt has {len(prompt)} tokens and"
                f" max_tokens is {params.max_tokens}; shorten the prompt or lower max_tokens"
            )
        seq = Sequence(request_id if request_id is not None else f"req-{next(self._ids)}", list(prompt), params,
                       eos_token_id=self.eos_token_id)
        if self.detokenize is not None:
            # A stream never sends the last characters a stop string may still cut.
            hold = max((len(s) for s in params.stop), default=1) - 1
            seq.detokenizer = IncrementalDetokenizer(self.detokenize, seq.output, hold=hold)
        with self._lock:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"the waiting queue is full (maxWaiting={self.max_waiting}); retry later")
            self.waiting.append(seq)
        return seq

    def cancel(self, request_id: str) -> None:
        """Ask for a request to end; it ends (finish_reason "cancelled") at the start of the next step."""
        with self._lock:
            self._cancels.add(request_id)

    def has_work(self) -> bool:
        """Requests, cancels, or a connector holding a transfer (a prefetch): not idle."""
        busy = self.connector is not None and self.connector.busy()
        return busy or bool(self.waiting) or any(s is not None for s in self.lanes) or bool(self._cancels)

    def running(self) -> list[Sequence]:
        return [s for s in self.lanes if s is not None]

    def stats(self) -> dict[str, float]:
        """The counters, the queue and the lanes, and whether the batcher is idle."""
        prefix_queried = self.counters["prompt_tokens"] if self.kv.prefix_cache else 0
        return {**self.counters, "waiting": len(self.waiting), "running": len(self.running()),
                "prefix_query_tokens": prefix_queried, "idle": 0.0 if self.has_work() else 1.0}

    # -- the step --------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        out: list[StepOutput] = []
        self.counters["steps"] += 1
        self._apply_cancels(out)
        self._admit(out)
        prefilling = [s for s in self.running() if s.status is Status.PREFILL]
        riders = self._riders(prefilling)
        self._prefill([s for s in prefilling if all(s is not r for r in riders)], out)
        self._decode(out, riders)
        if self.connector is not None:
            with self._lock:
                head = self.waiting[0] if self.waiting else None
            self.connector.after_step(self.lanes, head)
        return out

    def _apply_cancels(self, out: list[StepOutput]) -> None:
        with self._lock:
            cancels, self._cancels = self._cancels, set()
            kept = deque(s for s in self.waiting if s.id not in cancels)
            dropped = [s for s in self.waiting if s.id in cancels]
            self.waiting = kept
        for seq in dropped:
            self._finish(seq, FinishReason.CANCELLED, out)
        for seq in self.running():
            if seq.id in cancels:
                self._finish(seq, FinishReason.CANCELLED, out)

    def _admit(self, out: list[StepOutput]) -> None:
        for lane, held in enumerate(self.lanes):
            if held is not None:
                continue
            with self._lock:
                if not self.waiting:
                    return
                seq = self.waiting.popleft()
            seq.lane = lane
            self.lanes[lane] = seq
            self.counters["prompt_tokens"] += len(seq.prompt)
            try:
                alloc = self._allocate(seq)
                seq.block = alloc.block
                if alloc.source is not None:
                    try:
                        self.runner.copy_block(alloc.source, alloc.block)
                    finally:
                        self.kv.unpin(alloc.source)
                    seq.computed = seq.cached_tokens = alloc.cached_len
                    self.counters["cached_prompt_tokens"] += alloc.cached_len
                seq.status = Status.PREFILL
            except Exception as exc:  # noqa: BLE001 - isolate: this request fails, the batcher goes on
                self._fail(seq, exc, out)

    def _allocate(self, seq: Sequence) -> Allocation:
        """The lane's block (and prefix-cache source): one the connector prepared (a prefetch), or a new one."""
        if self.connector is not None and (alloc := self.connector.allocate(seq)) is not None:
            return alloc
        return self.kv.allocate(seq.id, seq.cacheable_prompt)

    def _riders(self, prefilling: list[Sequence]) -> list[Sequence]:
        """The lanes whose next prefill chunk goes through this step's decode forward, where the runner mixes
        them in (the weights are read once for both): local prefill only, and not a chunk that scores its prompt
        (prompt logprobs need every token's logits)."""
        if self.connector is not None or not getattr(self.runner, "mixes_prefill", False):
            return []
        return [s for s in prefilling if s.params.prompt_logprobs is None]

    def _prefill(self, seqs: list[Sequence], out: list[StepOutput]) -> None:
        """Each lane one prefill chunk further, on its own forward (or its connector's import)."""
        for seq in seqs:
            try:
                if self.connector is None:
                    start, chunk, last = self._next_chunk(seq)
                    self._chunk_done(seq, len(chunk), last, self.runner.prefill(seq, start, chunk, last), out)
                    continue
                done, token = self._import(seq)
                if done:
                    seq.status = Status.DECODE
                    self._append(seq, token, out)
            except Exception as exc:  # noqa: BLE001
                self._fail(seq, exc, out)

    def _next_chunk(self, seq: Sequence) -> tuple[int, list[int], bool]:
        """Where the lane's next prefill chunk starts, its tokens, and whether it ends the prompt."""
        start = seq.computed
        chunk = seq.prompt[start : start + self.prefill_chunk]
        return start, chunk, start + len(chunk) == len(seq.prompt)

    def _chunk_done(self, seq: Sequence, n: int, last: bool, token: int | None, out: list[StepOutput]) -> None:
        seq.computed += n
        self.counters["prefill_chunks"] += 1
        self.counters["prefill_tokens_computed"] += n
        if last:
            seq.status = Status.DECODE
            self._append(seq, token, out)

    def _import(self, seq: Sequence) -> tuple[bool, int | None]:
        """The connector's KV, once it has arrived, into the lane's block (the rest of the prompt at once)."""
        assert self.connector is not None
        loaded = self.connector.poll(seq)  # raises the transfer's error
        if loaded is None:
            return False, None
        ok = False
        try:
            if loaded.start != seq.computed:
                raise RuntimeError(f"shipment starts at {loaded.start}, the lane's block has {seq.computed} tokens")
            token = self.runner.load_kv(seq, loaded)
            ok = True
        finally:
            self.connector.release(seq, ok)  # the staging slot is free only now, after the import
        seq.computed = len(seq.prompt)
        return True, token

    def _decode(self, out: list[StepOutput], riders: list[Sequence] | None = None) -> None:
        """One decode step over the lanes that decode; with ``riders``, their prefill chunks go through the same
        forward (:meth:`Runner.mixed`) and they decode from the next step on."""
        batch = [s if s is not None and s.status is Status.DECODE else None for s in self.lanes]
        active = [s for s in batch if s is not None]
        if not active and not riders:
            return
        drafts = self._drafts(batch)
        if riders:
            chunks = [(seq, *self._next_chunk(seq)) for seq in riders]
            try:
                news, firsts = self.runner.mixed(batch, drafts, chunks)
            except Exception:  # noqa: BLE001 - find the request at fault: each chunk on its own, then the step
                self._prefill(riders, out)
                self._decode(out)
                return
            for (seq, _, tokens, last), token in zip(chunks, firsts, strict=True):
                try:
                    self._chunk_done(seq, len(tokens), last, token, out)
                except Exception as exc:  # noqa: BLE001
                    self._fail(seq, exc, out)
            if not active:
                return
        else:
            drafts, news = self._step_lanes(batch, drafts, out)
        self.counters["decode_steps"] += 1
        for seq, draft, new in zip(batch, drafts, news, strict=True):
            if seq is None or new is None or seq.finished:
                continue
            self.counters["draft_tokens"] += len(draft)
            self.counters["draft_tokens_accepted"] += len(new) - 1
            if draft:
                assert seq.drafter is not None  # it made the draft
                seq.drafter.kept(len(draft), len(new) - 1)
            for token in new:  # each token's KV (the one fed before it) is in the block now
                seq.computed += 1
                try:
                    self._append(seq, token, out)
                except Exception as exc:  # noqa: BLE001
                    self._fail(seq, exc, out)
                if seq.finished:  # a stop inside the accepted draft: the rest is dropped
                    break

    def _step_lanes(self, batch: list[Sequence | None], drafts: list[list[int]], out: list[StepOutput]
                    ) -> tuple[list[list[int]], list[list[int] | None]]:
        """The decode forward alone: the drafts it checked and each lane's new tokens (None for an empty or
        failed lane)."""
        try:
            if any(drafts):
                return drafts, self.runner.verify(batch, drafts)
            return drafts, [None if t is None else [t] for t in self.runner.decode(batch)]
        except Exception:  # noqa: BLE001 - find the request at fault: run each lane alone, without drafts
            news = [None if t is None else [t] for t in self._decode_lanes_alone(batch, out)]
            return [[] for _ in batch], news

    def _drafts(self, batch: list[Sequence | None]) -> list[list[int]]:
        """Each lane's draft: plain greedy lanes only (a draft is checked against the argmax), never past the
        request's max_tokens (so never past maxSeqLen)."""
        drafts: list[list[int]] = []
        for seq in batch:
            k = 0 if seq is None or not seq.params.plain_greedy else min(
                self.speculative_tokens, seq.params.max_tokens - len(seq.output) - 1)
            if k <= 0:
                drafts.append([])
                continue
            assert seq is not None
            if seq.drafter is None:
                seq.drafter = Drafter()
            drafts.append(seq.drafter.draft(seq.prompt, seq.output, k))
        return drafts

    def _decode_lanes_alone(self, batch: list[Sequence | None], out: list[StepOutput]) -> list[int | None]:
        # Rewriting a lane's KV at the same position with the same token is idempotent, so a retry is safe.
        tokens: list[int | None] = [None] * len(batch)
        for i, seq in enumerate(batch):
            if seq is None:
                continue
            alone: list[Sequence | None] = [None] * len(batch)
            alone[i] = seq
            try:
                tokens[i] = self.runner.decode(alone)[i]
            except Exception as exc:  # noqa: BLE001
                self._fail(seq, exc, out)
        return tokens

    # -- outcomes --------------------------------------------------------------------------------
    def _append(self, seq: Sequence, token: int | None, out: list[StepOutput]) -> None:
        if token is None:
            raise RuntimeError("the runner returned no token")
        seq.output.append(token)
        if seq.detokenizer is not None:
            seq.detokenizer.update()
        self.counters["generation_tokens"] += 1
        reason = self._stop_reason(seq, token)
        if reason is None:
            text = seq.detokenizer.stream_delta() if seq.detokenizer is not None else ""
            out.append(StepOutput(seq.id, (token,), False, text=text))
        else:
            self._finish(seq, reason, out, new=(token,))

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        p = seq.params
        n = len(seq.output)
        eos = not p.ignore_eos and token == self.eos_token_id
        if n >= p.min_tokens and (eos or token in p.stop_token_ids):  # vLLM: no stop before min_tokens
            # vLLM's rule: the stop token stays in token_ids but its text is not in the output.
            seq.stop_reason = None if eos else token
            if (det := seq.detokenizer) is not None:
                seq.stop_text = det.text if p.include_stop_str_in_output else det.text_before_last
            return FinishReason.STOP
        if n > p.min_tokens and p.stop and seq.detokenizer is not None:  # vLLM: stop strings past min_tokens
            hit = seq.detokenizer.find(p.stop)
            if hit is not None:
                at, stop = hit
                seq.stop_reason = stop
                text = seq.detokenizer.text
                seq.stop_text = text[: at + len(stop)] if p.include_stop_str_in_output else text[:at]
                return FinishReason.STOP
        if len(seq.output) >= p.max_tokens:
            return FinishReason.LENGTH
        return None

    def _fail(self, seq: Sequence, exc: Exception, out: list[StepOutput]) -> None:
        seq.failure = exc
        seq.error = f"{type(exc).__name__}: {exc}"
        log.warning("event=request_failed request_id=%s error=%r", seq.id, seq.error)
        self._finish(seq, FinishReason.ERROR, out)

    def _finish(self, seq: Sequence, reason: FinishReason, out: list[StepOutput], new: tuple[int, ...] = ()
                ) -> None:
        if self.connector is not None:
            self.connector.request_finished(seq, reason)
        if seq.block is not None:
            # After an error the block's KV may be half written: never cache it.
            valid = None if reason is FinishReason.ERROR else seq.tokens[: seq.computed]
            self.kv.release(seq.id, valid)
            seq.block = None
        if seq.lane is not None and self.lanes[seq.lane] is seq:
            self.lanes[seq.lane] = None
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        key = {FinishReason.ERROR: "requests_failed", FinishReason.CANCELLED: "requests_cancelled"}.get(
            reason, "requests_finished")
        self.counters[key] += 1
        text = ""
        if seq.detokenizer is not None:
            text = seq.detokenizer.stream_delta(seq.stop_text if seq.stop_text is not None else seq.detokenizer.text)
        out.append(StepOutput(seq.id, new, True, reason, seq.error, text, seq.failure))
