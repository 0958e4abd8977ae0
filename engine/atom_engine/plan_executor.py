"""Run a :class:`StepPlan` on a runner's forwards and return what each item gave, or the exception it failed with.

A failure is isolated by rewriting the work, not by recursion: a forward that fails and carries several
requests is replaced by smaller ones (a mixed step by each prefill chunk alone and the decode step; a decode step
by each lane alone, without drafts), queued behind the rest; a forward of one request that fails is that
request's failure. Rewriting a lane's KV at the same positions with the same tokens is idempotent, so a retry is
safe. Pure Python: the runner owns the tensors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from atom_engine.capabilities import Capabilities
from atom_engine.kv_connector import LoadedKV
from atom_engine.sequence import Sequence
from atom_engine.step_plan import Chunk, DecodeBatch, StepPlan, StepResult

T = TypeVar("T")


class Runner(Protocol):
    """The forwards a plan runs on. Implementations own all device tensors; ``capabilities`` says which of the
    optional forwards (``verify``, ``mixed``) they have."""

    capabilities: Capabilities

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
        """A verify step and prefill chunks ``(seq, start, tokens, last)`` in one forward (only where the
        backend mixes steps); returns verify's result and each chunk's first output token (None if not last)."""

    def copy_block(self, src: int, dst: int) -> None:
        """Copy a whole KV block (a prefix-cache hit)."""

    def load_kv(self, seq: Sequence, loaded: LoadedKV) -> int:
        """Import KV computed elsewhere into ``seq.block`` (positions ``loaded.start..``) and return the first
        output token, sampled from the shipped logits (only with a KV connector)."""


@dataclass(frozen=True)
class _Mixed:
    riders: tuple[int, ...]  # indices into plan.riders


@dataclass(frozen=True)
class _Decode:
    lanes: tuple[int, ...]  # the lanes this forward computes (the rest are padded as empty)
    drafts: bool  # with the plan's drafts (a lane retried alone has none)


@dataclass(frozen=True)
class _Ride:
    rider: int  # a rider on its own forward, after its mixed step failed


def execute(runner: Runner, plan: StepPlan) -> StepResult:
    batch = plan.decode
    if batch is not None and batch.plain and not (plan.admissions or plan.chunks or plan.imports or plan.riders):
        return _plain_decode(runner, batch)
    result = StepResult(copies=[None] * len(plan.admissions), chunks=[None] * len(plan.chunks),
                        imports=[0] * len(plan.imports), riders=[None] * len(plan.riders))
    failed: dict[str, Exception] = {}  # a request's first failure: its later items are not run

    def guarded(seq: Sequence, run: Callable[[], T]) -> T | Exception:
        if seq.id in failed:
            return failed[seq.id]
        try:
            return run()
        except Exception as exc:  # noqa: BLE001 - this item's failure, reported in the result
            failed[seq.id] = exc
            return exc

    for i, a in enumerate(plan.admissions):
        if a.source is not None:
            source = a.source
            copied = guarded(a.seq, lambda a=a, source=source: runner.copy_block(source, a.block))
            result.copies[i] = copied if isinstance(copied, Exception) else None
    for i, c in enumerate(plan.chunks):
        result.chunks[i] = guarded(c.seq, lambda c=c: runner.prefill(c.seq, c.start, list(c.tokens), c.last))
    for i, imp in enumerate(plan.imports):
        result.imports[i] = guarded(imp.seq, lambda imp=imp: runner.load_kv(imp.seq, imp.loaded))

    if batch is None:
        return result
    result.decode = [None] * len(batch.lanes)
    result.drafts = list(batch.drafts)
    active = batch.indices
    work: deque[_Mixed | _Decode | _Ride] = deque()
    if plan.riders:
        work.append(_Mixed(tuple(i for i, r in enumerate(plan.riders) if r.seq.id not in failed)))
        for i, r in enumerate(plan.riders):
            if r.seq.id in failed:
                result.riders[i] = failed[r.seq.id]
    elif active:
        work.append(_Decode(active, not batch.plain))
    _run(runner, plan, work, result)
    return result


def _plain_decode(runner: Runner, batch: DecodeBatch) -> StepResult:
    """A decode step and nothing else, without drafts: the step an overlapped engine runs between two forwards,
    so it walks the lanes once; a failure goes on as in any plan (each lane alone)."""
    result = StepResult(decode=[None] * len(batch.lanes), drafts=list(batch.drafts))
    active = batch.indices
    if not active:
        return result
    try:
        tokens = runner.decode(list(batch.lanes))
    except Exception as exc:  # noqa: BLE001 - find the lane at fault, as _run does
        _run(runner, StepPlan(decode=batch), deque(_isolate(_Decode(active, False), active, exc, result)), result)
        return result
    _fill_tokens(result, active, tokens)
    return result


def _run(runner: Runner, plan: StepPlan, work: deque[_Mixed | _Decode | _Ride], result: StepResult) -> None:
    """Run the decode forwards in ``work``, rewriting a failed one into smaller ones behind the rest."""
    batch = plan.decode
    assert batch is not None
    active = batch.indices
    while work:
        item = work.popleft()
        try:
            if isinstance(item, _Mixed):
                riders = [plan.riders[i] for i in item.riders]
                news, firsts = runner.mixed(list(batch.lanes), [list(d) for d in batch.drafts],
                                            [_chunk_args(c) for c in riders])
                for i, token in zip(item.riders, firsts, strict=True):
                    result.riders[i] = token
                _fill(result, active, news)
            elif isinstance(item, _Ride):
                r = plan.riders[item.rider]
                result.riders[item.rider] = runner.prefill(r.seq, r.start, list(r.tokens), r.last)
            elif item.drafts:
                news = runner.verify(list(batch.lanes), [list(d) for d in batch.drafts])
                _fill(result, item.lanes, news)
            else:
                if item.lanes == active:
                    alone = list(batch.lanes)
                else:
                    alone = [s if i in item.lanes else None for i, s in enumerate(batch.lanes)]
                _fill_tokens(result, item.lanes, runner.decode(alone))
        except Exception as exc:  # noqa: BLE001 - find the request at fault: rewrite into smaller forwards
            work.extend(_isolate(item, active, exc, result))


def _chunk_args(c: Chunk) -> tuple[Sequence, int, list[int], bool]:
    return c.seq, c.start, list(c.tokens), c.last


def _fill(result: StepResult, lanes: tuple[int, ...], news: list[list[int] | None]) -> None:
    for i in lanes:
        new = news[i]
        result.decode[i] = RuntimeError("the runner returned no token") if not new else list(new)


def _fill_tokens(result: StepResult, lanes: tuple[int, ...], tokens: list[int | None]) -> None:
    decoded = result.decode
    for i in lanes:
        token = tokens[i]
        decoded[i] = RuntimeError("the runner returned no token") if token is None else [token]


def _isolate(item: _Mixed | _Decode | _Ride, active: tuple[int, ...], exc: Exception, result: StepResult
             ) -> list[_Mixed | _Decode | _Ride]:
    """The smaller forwards that replace a failed one; none when it held one request (recorded as its failure)."""
    if isinstance(item, _Mixed):
        return [*(_Ride(i) for i in item.riders), *([_Decode(active, any(result.drafts))] if active else [])]
    if isinstance(item, _Ride):
        result.riders[item.rider] = exc
        return []
    if len(item.lanes) > 1 or item.drafts:
        for i in item.lanes:
            result.drafts[i] = ()
        return [_Decode((i,), False) for i in item.lanes]
    result.decode[item.lanes[0]] = exc
    return []
