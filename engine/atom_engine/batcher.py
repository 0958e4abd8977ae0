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

A step is three phases, as vLLM v1's scheduler and model runner split it: :meth:`Batcher.schedule` decides
(a :class:`~atom_engine.step_plan.StepPlan`: admissions with their copy sources, prefill chunks, imports, riders,
the decode batch with its drafts), :func:`~atom_engine.plan_executor.execute` runs the plan on the runner's
forwards (a failed forward of several requests is rewritten into smaller ones there, and a request at fault gets
its own failure), and :meth:`Batcher.apply` folds the result back in: tokens appended, stops decided by the
:class:`~atom_engine.output_processor.OutputProcessor`, blocks released. A lane that finishes its prompt in a
step decodes from the next step on.

The model is behind :class:`~atom_engine.plan_executor.Runner`, so the batcher runs against a fake in tests and
the torch runner in pods.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from atom_engine.errors import ContextTooLong, QueueFull, RequestRejected
from atom_engine.kv_blocks import Allocation, KVBlocks, NoKVBlockAvailable
from atom_engine.kv_connector import KVConnector
from atom_engine.output_processor import OutputProcessor, Pending
from atom_engine.plan_executor import Runner, execute
from atom_engine.request_tallies import RequestTallies
from atom_engine.sequence import FinishReason, SamplingParams, Sequence, Status, StepOutput
from atom_engine.speculation import Drafter
from atom_engine.stats import BatcherCounters, BatcherStats
from atom_engine.step_plan import Admission, Chunk, DecodeBatch, Import, StepPlan, StepResult

log = logging.getLogger(__name__)


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``connector``: where prompt KV comes from instead of local prefill (None: every prompt is prefilled
        here). ``speculative_tokens``: the longest draft a greedy lane feeds per decode step (0: none). ``clock``:
        what a request's decode seconds are read from (its first token to its end)."""
        self.runner = runner
        self.kv = kv
        self.lanes: list[Sequence | None] = [None] * lanes
        self.max_seq_len = max_seq_len
        self.prefill_chunk = prefill_chunk
        self.max_waiting = max_waiting
        self.eos_token_id = eos_token_id
        self.outputs = OutputProcessor(detokenize, eos_token_id)
        self.connector = connector
        self.speculative_tokens = speculative_tokens
        self.clock = clock
        self.mixes_prefill = runner.capabilities.mixed  # prefill chunks ride in the decode forward
        self.waiting: deque[Sequence] = deque()
        self._lock = threading.Lock()  # add/cancel may come from another thread than step
        self._cancels: set[str] = set()
        self._ids = itertools.count()
        self._ended: list[Pending] = []  # decided while planning (cancels, refused admissions)
        self._unreleased: list[Sequence] = []  # ended while a step that holds their blocks runs (see process)
        # A step runs on the device while this thread plans or applies (atom_engine.overlap): whatever ends now
        # keeps its lane and block until the next apply, as the running step may write into the block.
        self.in_flight = False
        self.last_plan: StepPlan = StepPlan()
        self._no_drafts: tuple[tuple[int, ...], ...] = ((),) * lanes  # every lane's draft, without speculation
        self.counters = BatcherCounters()
        self.requests = RequestTallies(max_seq_len)
        self._iterated = 0  # prompt tokens prefilled and tokens generated, up to the last step applied

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
                       eos_token_id=self.eos_token_id, arrived_at=self.clock())
        with self._lock:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"the waiting queue is full (maxWaiting={self.max_waiting}); retry later")
            self.outputs.add(seq)
            self.waiting.append(seq)
            self.counters.arrived_requests += 1
            self.counters.arrived_prompt_tokens += len(prompt)
            self.counters.arrived_max_tokens += params.max_tokens
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

    def stats(self) -> BatcherStats:
        """The counters, the queue and the lanes, and whether the batcher is idle."""
        prefix_queried = self.counters.prompt_tokens if self.kv.prefix_cache else 0
        return BatcherStats(**self.counters, waiting=len(self.waiting), running=len(self.running()),
                            prefix_query_tokens=prefix_queried, idle=0.0 if self.has_work() else 1.0,
                            waiting_for_kv=sum(s.status is Status.PREFILL for s in self.running())
                            if self.connector else 0)

    # -- the step --------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """Plan, run the plan, apply its result and make the outputs: one step, serially."""
        plan = self.schedule()
        return self.process(self.apply(plan, execute(self.runner, plan)))

    def schedule(self, *, running: StepPlan | None = None) -> StepPlan:
        """Decide the step: cancels (ended now), admissions into free lanes, each prefilling lane's next chunk
        (or its connector's import, once arrived), and the decode batch of the lanes that decode. ``running``:
        planned while that plain decode step runs (:mod:`atom_engine.overlap`), which gives each of its lanes one
        more token, not appended yet: a lane that reaches its max_tokens with it is left out."""
        self.counters.steps += 1
        self._apply_cancels()
        admissions = self._admit()
        prefilling = [s for s in self.running() if s.status is Status.PREFILL]
        riders = self._riders(prefilling)
        chunks: list[Chunk] = []
        imports: list[Import] = []
        for seq in prefilling:
            if any(seq is r for r in riders):
                continue
            if self.connector is None or not self.connector.ships(seq):
                chunks.append(self._next_chunk(seq))
            elif (imp := self._poll(seq)) is not None:
                imports.append(imp)
        if running is not None and running.decode is not None:
            batch = tuple(s if s is not None and s.status is Status.DECODE
                          and (r is not s or len(s.output) + 1 < s.params.max_tokens) else None
                          for s, r in zip(self.lanes, running.decode.lanes, strict=True))
        else:
            batch = tuple(s if s is not None and s.status is Status.DECODE else None for s in self.lanes)
        decode = None
        if riders or any(s is not None for s in batch):
            drafts = self._no_drafts if self.speculative_tokens <= 0 else tuple(
                tuple(d) for d in self._drafts(batch))
            decode = DecodeBatch(batch, drafts)
        plan = StepPlan(tuple(admissions), tuple(chunks), tuple(imports),
                        tuple(self._next_chunk(s) for s in riders), decode)
        self.last_plan = plan
        return plan

    def apply(self, plan: StepPlan, result: StepResult, *, taken: bool = False) -> list[Pending]:
        """Fold a run of ``plan`` back in: each item's tokens or failure, the requests that end by a token's id;
        returns what :meth:`process` makes the step's outputs from. ``taken``: :meth:`take_tokens` appended the
        decode step's tokens already."""
        for seq in self._unreleased:
            self._release(seq)
        self._unreleased = []
        out, self._ended = self._ended, []
        for a, failure in zip(plan.admissions, result.copies, strict=True):
            if a.source is not None:
                self.kv.unpin(a.source)
            if failure is not None:
                self._fail(a.seq, failure, out)
        for c, token in zip(plan.chunks, result.chunks, strict=True):
            self._chunk_done(c, token, out)
        for imp, token in zip(plan.imports, result.imports, strict=True):
            self._imported(imp, token, out)
        for c, token in zip(plan.riders, result.riders, strict=True):
            self._chunk_done(c, token, out)
        if plan.decode is not None and plan.decode.indices:
            self._decoded(plan.decode, result, out, taken)
        if self.connector is not None:
            with self._lock:
                head = self.waiting[0] if self.waiting else None
            self.connector.after_step(self.lanes, head)
        # The step's tokens, as the counters moved since the last step applied (a decode step's tokens taken
        # before its apply count with it).
        iterated = self.counters.prefill_tokens_computed + self.counters.generation_tokens
        self.requests.iteration(iterated - self._iterated)
        self._iterated = iterated
        return out

    # -- planning ----------------------------------------------------------------------------------
    def _apply_cancels(self) -> None:
        with self._lock:
            cancels, self._cancels = self._cancels, set()
            kept = deque(s for s in self.waiting if s.id not in cancels)
            dropped = [s for s in self.waiting if s.id in cancels]
            self.waiting = kept
        for seq in [*dropped, *(s for s in self.running() if s.id in cancels and not s.finished)]:
            self._finish(seq, FinishReason.CANCELLED)
            self._ended.append(Pending(seq, (), len(seq.output), True))

    def _admit(self) -> list[Admission]:
        admissions: list[Admission] = []
        for lane, held in enumerate(self.lanes):
            if held is not None:
                continue
            with self._lock:
                if not self.waiting:
                    break
                seq = self.waiting.popleft()
            try:
                alloc = self._allocate(seq)
            except NoKVBlockAvailable as exc:
                if any(a.source is not None for a in admissions):
                    # This step's copy sources stay pinned until the plan has run (the block rule counts one
                    # copy source): the request waits at the head of the queue for the next step.
                    with self._lock:
                        self.waiting.appendleft(seq)
                    break
                self._refuse(seq, lane, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - isolate: this request fails, the batcher goes on
                self._refuse(seq, lane, exc)
                continue
            seq.lane = lane
            self.lanes[lane] = seq
            seq.admitted_at = self.clock()
            self.counters.prompt_tokens += len(seq.prompt)
            seq.block = alloc.block
            if alloc.source is not None:  # the copy runs with the plan; the source stays pinned until then
                seq.computed = seq.cached_tokens = alloc.cached_len
                self.counters.cached_prompt_tokens += alloc.cached_len
                self.counters.prompt_tokens_cached += alloc.cached_len
            seq.status = Status.PREFILL
            admissions.append(Admission(seq, alloc.block, alloc.source, alloc.cached_len if alloc.source else 0))
        return admissions

    def _refuse(self, seq: Sequence, lane: int, exc: Exception) -> None:
        """A request whose admission failed: it held the lane for this step (as an admitted one), then fails."""
        seq.lane = lane
        self.lanes[lane] = seq
        seq.admitted_at = self.clock()
        self.counters.prompt_tokens += len(seq.prompt)
        self._fail(seq, exc, self._ended)

    def _allocate(self, seq: Sequence) -> Allocation:
        """The lane's block (and prefix-cache source): one the connector prepared (a prefetch), or a new one."""
        if self.connector is not None and (alloc := self.connector.allocate(seq)) is not None:
            return alloc
        return self.kv.allocate(seq.id, seq.cacheable_prompt)

    def _riders(self, prefilling: list[Sequence]) -> list[Sequence]:
        """The lanes whose next prefill chunk goes through this step's decode forward, where the runner mixes
        them in (the weights are read once for both): local prefill only, and not a chunk that scores its prompt
        (prompt logprobs need every token's logits)."""
        if self.connector is not None or not self.mixes_prefill:
            return []
        return [s for s in prefilling if s.params.prompt_logprobs is None]

    def _next_chunk(self, seq: Sequence) -> Chunk:
        """The lane's next prefill chunk: where it starts, its tokens, and whether it ends the prompt."""
        start = seq.computed
        tokens = seq.prompt[start : start + self.prefill_chunk]
        return Chunk(seq, start, tokens, start + len(tokens) == len(seq.prompt))

    def _poll(self, seq: Sequence) -> Import | None:
        """The connector's KV for the lane, once it has arrived (the rest of the prompt at once)."""
        assert self.connector is not None
        try:
            loaded = self.connector.poll(seq)  # raises the transfer's error
            if loaded is None:
                return None
            if loaded.start != seq.computed:
                self.connector.release(seq, False)
                raise RuntimeError(f"shipment starts at {loaded.start}, the lane's block has {seq.computed} tokens")
        except Exception as exc:  # noqa: BLE001
            self._fail(seq, exc, self._ended)
            return None
        return Import(seq, loaded)

    def _drafts(self, batch: tuple[Sequence | None, ...]) -> list[list[int]]:
        """Each lane's draft: greedy lanes only (a draft is checked against the argmax), never past the
        request's max_tokens (so never past maxSeqLen)."""
        drafts: list[list[int]] = []
        for seq in batch:
            k = 0 if seq is None or not seq.params.takes_drafts else min(
                self.speculative_tokens, seq.params.max_tokens - len(seq.output) - 1)
            if k <= 0:
                drafts.append([])
                continue
            assert seq is not None
            if seq.drafter is None:
                seq.drafter = Drafter()
            drafts.append(seq.drafter.draft(seq.prompt, seq.output, k))
        return drafts

    # -- applying ----------------------------------------------------------------------------------
    def _chunk_done(self, c: Chunk, token: int | None | Exception, out: list[Pending]) -> None:
        seq = c.seq
        if seq.finished:
            return
        if isinstance(token, Exception):
            self._fail(seq, token, out)
            return
        seq.computed += len(c.tokens)
        self.counters.prefill_chunks += 1
        self.counters.prefill_tokens_computed += len(c.tokens)
        if c.last:
            self._decodes(seq)
            self._append(seq, token, out)

    def _imported(self, imp: Import, token: int | Exception, out: list[Pending]) -> None:
        seq = imp.seq
        assert self.connector is not None
        self.connector.release(seq, not isinstance(token, Exception))  # the staging slot is free only now
        if seq.finished:
            return
        if isinstance(token, Exception):
            self._fail(seq, token, out)
            return
        self.counters.prompt_tokens_cached += len(seq.prompt) - seq.computed  # imported: computed elsewhere
        seq.computed = len(seq.prompt)
        self._decodes(seq)
        self._append(seq, token, out)

    def take_tokens(self, plan: StepPlan, result: StepResult) -> None:
        """Append a plain decode step's tokens to their lanes, and nothing else, so that the step planned while it
        ran (``schedule(running=plan)``) feeds them; :meth:`apply` with ``taken`` does the rest later. A lane that
        ended while the step ran (a stop, a cancel, a failure) takes no token: it is dropped."""
        assert plan.decode is not None
        finished = Status.FINISHED
        lanes, decoded = plan.decode.lanes, result.decode
        for i in plan.decode.indices:
            seq, new = lanes[i], decoded[i]
            if seq.status is finished:
                if seq.params.logprobs is not None:  # the dropped token's, if the sampler made one
                    del seq.logprobs[len(seq.output):]
            elif type(new) is list and len(new) == 1 and new[0] is not None:
                seq.computed += 1
                seq.output.append(new[0])

    def _decoded(self, batch: DecodeBatch, result: StepResult, out: list[Pending], taken: bool = False) -> None:
        self.counters.decode_steps += 1
        for seq, draft, new in zip(batch.lanes, result.drafts, result.decode, strict=True):
            if seq is None or seq.status is Status.FINISHED:
                continue
            if not draft and type(new) is list and len(new) == 1 and new[0] is not None:  # plain: one token
                if taken:
                    self._took(seq, new[0], out)
                else:
                    seq.computed += 1  # before the token: a stop releases the block with the KV it holds
                    self._append(seq, new[0], out)
                continue
            if isinstance(new, Exception) or new is None:
                self._fail(seq, new if isinstance(new, Exception) else RuntimeError("the runner returned no token"),
                           out)
                continue
            self.counters.draft_tokens += len(draft)
            self.counters.draft_tokens_accepted += len(new) - 1
            if draft:
                assert seq.drafter is not None  # it made the draft
                seq.drafter.kept(len(draft), len(new) - 1)
            for token in new:  # each token's KV (the one fed before it) is in the block now
                seq.computed += 1
                self._append(seq, token, out)
                if seq.finished:  # a stop inside the accepted draft: the rest is dropped
                    break

    # -- outputs -----------------------------------------------------------------------------------
    def process(self, pending: list[Pending], *, step_running: bool = False) -> list[StepOutput]:
        """The step's outputs from :meth:`apply`'s news: each token taken into its request's text, where a stop
        string may end the request (the tokens after it are dropped). ``step_running``: a later step, which may
        hold the blocks of requests ended here, is running; their blocks are released when it is applied."""
        out: list[StepOutput] = []
        for p in pending:
            seq = p.seq
            if seq.output_done:  # its final output was made (a stop string earlier in the step)
                continue
            if not p.tokens:  # cancelled or failed
                seq.text = self.outputs.text(seq)
                out.append(self._emit(seq, (), p.at, True))
                continue
            ended = (seq.finish_reason, seq.stop_reason) if p.finishing else None
            if seq.finished and not p.finishing and seq.finish_reason in (FinishReason.CANCELLED, FinishReason.ERROR):
                out.append(self._emit(seq, p.tokens, p.at, False))  # its own final output follows
                continue
            try:
                stop = self.outputs.text_stop(seq, p.tokens[0], p.at, ended)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - a tokenizer failure ends this request only
                if not seq.finished:
                    self._fail(seq, exc, [], release=not step_running)
                seq.text = self.outputs.text(seq)
                out.append(self._emit(seq, p.tokens, p.at, True))
                continue
            if stop is None:
                out.append(self._emit(seq, p.tokens, p.at, False))
                continue
            dropped = len(seq.output) - (p.at + 1)
            if dropped:  # a stop string inside an accepted draft: the rest of the draft is not output
                del seq.output[p.at + 1 :]
                self.counters.generation_tokens -= dropped
                if not seq.finished:
                    seq.computed -= dropped
            if not seq.finished:
                self._finish(seq, stop.reason, release=not step_running)
            seq.finish_reason = stop.reason
            seq.stop_reason = stop.stop_reason
            seq.stop_text = stop.text if stop.reason is FinishReason.STOP else None
            seq.text = stop.text
            out.append(self._emit(seq, p.tokens, p.at, True))
        return out

    def _emit(self, seq: Sequence, tokens: tuple[int, ...], at: int, final: bool) -> StepOutput:
        seq.output_done = final
        if final:  # once per request, its finish reason settled (a stop string may have changed it)
            self.requests.ended(seq, self.clock())
        return self.outputs.emit(seq, tokens, at, final)

    # -- outcomes --------------------------------------------------------------------------------
    def _decodes(self, seq: Sequence) -> None:
        """Its prompt's KV is complete: from its first token on, its lane decodes."""
        seq.status = Status.DECODE
        seq.decode_began = self.clock()

    def _append(self, seq: Sequence, token: int | None, out: list[Pending]) -> None:
        if token is None:
            self._fail(seq, RuntimeError("the runner returned no token"), out)
            return
        seq.output.append(token)
        self._took(seq, token, out)

    def _took(self, seq: Sequence, token: int, out: list[Pending]) -> None:
        """A token just appended to ``seq.output``: counted, and whether it ends the request by its id."""
        self.counters.generation_tokens += 1
        ended = self.outputs.token_stop(seq, token)
        if ended is not None:
            seq.stop_reason = ended[1]
            self._finish(seq, ended[0])
        out.append(Pending(seq, (token,), len(seq.output) - 1, ended is not None))

    def _fail(self, seq: Sequence, exc: Exception, out: list[Pending], *, release: bool = True) -> None:
        seq.failure = exc
        seq.error = f"{type(exc).__name__}: {exc}"
        log.warning("event=request_failed request_id=%s error=%r", seq.id, seq.error)
        self._finish(seq, FinishReason.ERROR, release=release)
        out.append(Pending(seq, (), len(seq.output), True))

    def _finish(self, seq: Sequence, reason: FinishReason, *, release: bool = True) -> None:
        """End ``seq``; its lane and block go now, or (``release`` false, or ``in_flight``: a running step may
        still write into the block) when the next step is applied."""
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        if reason is FinishReason.ERROR:
            self.counters.requests_failed += 1
        elif reason is FinishReason.CANCELLED:
            self.counters.requests_cancelled += 1
        else:
            self.counters.requests_finished += 1
        if seq.decode_began is not None:
            self.counters.decode_seconds += self.clock() - seq.decode_began
            self.counters.decoded_max_tokens += seq.params.max_tokens
        if release and not self.in_flight:
            self._release(seq)
        else:
            self._unreleased.append(seq)

    def _release(self, seq: Sequence) -> None:
        assert seq.finish_reason is not None
        if self.connector is not None:
            self.connector.request_finished(seq, seq.finish_reason)
        if seq.block is not None:
            # After an error the block's KV may be half written: never cache it.
            valid = None if seq.finish_reason is FinishReason.ERROR else seq.tokens[: seq.computed]
            self.kv.release(seq.id, valid)
            seq.block = None
        if seq.lane is not None and self.lanes[seq.lane] is seq:
            self.lanes[seq.lane] = None
