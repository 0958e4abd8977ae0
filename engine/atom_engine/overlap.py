"""Overlapped scheduling: while the device runs step N, a host thread finishes applying step N-1 (stops by token
id, counters), makes its outputs (text, stop strings, logprobs, the StepOutputs) and plans step N+1, so the
device does not wait for that Python between steps (vLLM v1's async scheduling, SGLang's overlap scheduler).

One :meth:`OverlappedSteps.step` call, on the thread that owns the model (the server's compute thread: every
forward stays on it, see ``server/compute.py``): take the step planned during the last one (or plan it now), hand
the host thread its share, run the step, then take the host thread's outputs and plan. The host thread never
calls torch.

Planning ahead: while a plain decode step N runs (no admissions, prefill chunks, imports or drafts; no
grammar; no KV connector), the host thread plans N+1 assuming every decoding lane goes on with the token N is
computing (a lane that reaches max_tokens with it is left out). When N returns, its tokens are appended to
their lanes (:meth:`Batcher.take_tokens`, a few microseconds: the runner reads each lane's last token and
position from its sequence) and N+1 runs at once; applying the rest of N (stops by token id, counters), making
its outputs and planning N+2 happen on the host thread meanwhile. A lane that N ended (a stop token, a stop
string, a cancel, a failure) rides N+1 with the others: its N+1 token is dropped, and its lane and block are
released only when N+1 is applied (N+1 writes into the block). After a step that is not a plain decode step,
its result is applied on this thread before the next step is planned, and only its outputs are made beside the
next forward.

Outputs come two calls later than serially (one after a step that was not planned ahead), and are the serial
engine's token for token. What differs is timing only: a lane that ends is refilled a step or two later, a
prefix-cache entry it leaves is found from then on, and a step whose every lane ended at the step before runs
for nothing.

The engine overlaps only where the backend runs on a device of its own (``Capabilities.devices``): on the cpu
backend host work and forwards share the same cores, so there is nothing to hide.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from atom_engine.batcher import Batcher
from atom_engine.output_processor import Pending
from atom_engine.plan_executor import Runner, execute
from atom_engine.sequence import StepOutput
from atom_engine.step_plan import StepPlan, StepResult


class OverlappedSteps:
    def __init__(self, batcher: Batcher, runner: Runner) -> None:
        self.batcher, self.runner = batcher, runner
        self._host = _HostThread()
        self._applied: list[Pending] = []  # the last step, applied; its outputs not made yet
        self._taken: tuple[StepPlan, StepResult] | None = None  # the last step: tokens taken, the rest to apply
        self._next: StepPlan | None = None  # planned while the last step ran

    @property
    def holding(self) -> bool:
        """A step whose outputs are still to be made, or a step planned ahead (the next calls run them)."""
        return bool(self._applied) or self._taken is not None or self._next is not None

    def step(self) -> list[StepOutput]:
        plan, self._next = self._next, None
        if plan is None:
            plan = self.batcher.schedule()
        applied, self._applied = self._applied, []
        taken, self._taken = self._taken, None
        if not plan.runs_forward:  # nothing to overlap with: the last step's outputs now, then the plan's own
            outs, _ = self._host_share(applied, taken, None)
            return outs + self.batcher.process(self.batcher.apply(plan, execute(self.runner, plan)))
        self._host.submit(self._host_share, applied, taken, plan)
        try:
            result = execute(self.runner, plan)
        except BaseException:
            self._host.wait()  # the host thread leaves the batcher before the error goes up
            raise
        outs, ahead = self._host.result()  # a bug on the host thread ends the loop, as serially
        if ahead is not None:
            self.batcher.take_tokens(plan, result)
            self._taken, self._next = (plan, result), ahead
        else:
            self._applied = self.batcher.apply(plan, result)
        return outs

    def _host_share(self, applied: list[Pending], taken: tuple[StepPlan, StepResult] | None,
                    running: StepPlan | None) -> tuple[list[StepOutput], StepPlan | None]:
        """The host's part of a step, beside ``running`` (None: none runs): the rest of applying the last step
        (``taken``), the outputs, and, where ``running`` is a plain decode step, the next plan."""
        b = self.batcher
        b.in_flight = running is not None
        try:
            if taken is not None:
                applied = applied + b.apply(*taken, taken=True)
            outs = b.process(applied, step_running=running is not None) if applied else []
            ahead = b.schedule(running=running) if running is not None and self._plain_decode(running) else None
        finally:
            b.in_flight = False
        return outs, ahead

    def _plain_decode(self, plan: StepPlan) -> bool:
        """Whether the next step may be planned while ``plan`` runs: a decode step and nothing else, without
        drafts (a stop string inside an accepted draft cuts the output the next step would read), grammars (a
        lane's matcher takes its tokens as they are sampled) or a KV connector (whose transfers follow the
        applied steps)."""
        b = self.batcher
        if plan.decode is None or plan.admissions or plan.chunks or plan.imports or plan.riders:
            return False
        if b.connector is not None or b.speculative_tokens > 0 or any(plan.decode.drafts):
            return False
        return all(s is None or s.params.grammar is None for s in plan.decode.lanes)

    def close(self) -> None:
        self._host.close()


class _HostThread:
    """One job at a time on a thread of its own: two queues, no futures (the handoff is between two forwards)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="atom-outputs", daemon=True)
        self._thread.start()
        self._busy = False

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args = job
            try:
                self._done.put((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - raised on the stepping thread, by result()
                self._done.put((False, exc))

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:  # noqa: ANN401
        assert not self._busy, "one job at a time"
        self._busy = True
        self._jobs.put((fn, args))

    def result(self) -> Any:  # noqa: ANN401
        """The job's return value, or its exception raised here."""
        ok, value = self._done.get()
        self._busy = False
        if not ok:
            raise value
        return value

    def wait(self) -> None:
        """Until the job has ended, whatever its outcome."""
        if self._busy:
            self._done.get()
            self._busy = False

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
