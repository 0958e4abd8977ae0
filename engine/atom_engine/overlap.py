"""Overlapped scheduling: while the device runs step N, the host applies step N-1, plans step N+1 and makes step
N-1's outputs, so the device does not wait for Python between steps (vLLM v1's async scheduling, SGLang's overlap
scheduler).

One :meth:`OverlappedSteps.step` call: wait for the running step and apply it (tokens, stops by token id, lanes
freed), plan the next step and start it on the device thread, then make the applied step's outputs (text, stop
strings, logprobs) while it runs. The outputs are the serial engine's, token for token: a request that a stop
string ends has one more step computed for it, whose tokens are dropped, and its lane and block are released
only when that step is applied (it may still write into the block). What differs is timing only: such a lane is
refilled one step later, and a prefix-cache entry it leaves is found from the step after.
"""

from __future__ import annotations

import concurrent.futures
import threading

from atom_engine.batcher import Batcher
from atom_engine.plan_executor import Runner, execute
from atom_engine.sequence import StepOutput
from atom_engine.step_plan import StepPlan, StepResult


class OverlappedSteps:
    def __init__(self, batcher: Batcher, runner: Runner) -> None:
        self.batcher, self.runner = batcher, runner
        self._device = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="atom-device")
        self._running: tuple[StepPlan, concurrent.futures.Future[StepResult]] | None = None

    @property
    def running(self) -> bool:
        """A step is on the device (its outputs are still to come)."""
        return self._running is not None

    def step(self) -> list[StepOutput]:
        pending = []
        if self._running is not None:
            plan, future = self._running
            self._running = None
            pending = self.batcher.apply(plan, future.result())  # a bug in execute ends the loop, as serially
        plan = self.batcher.schedule()
        if plan.runs_forward:
            started = threading.Event()
            self._running = (plan, self._device.submit(self._execute, plan, started))
            # Hand the GIL over until the device thread has begun: else it waits for the interpreter's switch
            # interval (5 ms) while this thread makes the outputs, and the two run one after the other.
            started.wait()
        else:  # nothing to compute (every lane waits): apply now, for the cancels and refusals it decided
            pending += self.batcher.apply(plan, execute(self.runner, plan))
        return self.batcher.process(pending, step_running=self._running is not None)

    def _execute(self, plan: StepPlan, started: threading.Event) -> StepResult:
        started.set()
        return execute(self.runner, plan)

    def drain(self) -> list[StepOutput]:
        """Apply the running step (if any) and make its outputs, starting nothing new."""
        if self._running is None:
            return []
        plan, future = self._running
        self._running = None
        return self.batcher.process(self.batcher.apply(plan, future.result()))

    def close(self) -> None:
        self._device.shutdown(wait=True)
