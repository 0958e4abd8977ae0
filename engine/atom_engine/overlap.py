"""Overlapped scheduling: while the device runs step N, a host thread makes step N-1's outputs (text, stop strings,
logprobs, the StepOutputs), so the device does not wait for that Python between steps (vLLM v1's async
scheduling, SGLang's overlap scheduler).

One :meth:`OverlappedSteps.step` call, on the thread that owns the model (the server's compute thread: every
forward stays on it, see ``server/compute.py``): plan step N (which needs step N-1 applied), hand step N-1's
outputs to the host thread, run step N, then take those outputs and apply step N (tokens, stops by token id,
lanes freed). The host thread never calls torch. Outputs come one call later than serially, and are the serial
engine's token for token: a request that a stop string ends has one more step computed for it, whose tokens are
dropped, and its lane and block are released only when that step is applied (it may still write into the block).
What differs is timing only: such a lane is refilled one step later, and a prefix-cache entry it leaves is found
from the step after.

The engine overlaps only where the backend runs on a device of its own (``Capabilities.devices``): on the cpu
backend host work and forwards share the same cores, so there is nothing to hide.
"""

from __future__ import annotations

import concurrent.futures

from atom_engine.batcher import Batcher
from atom_engine.output_processor import Pending
from atom_engine.plan_executor import Runner, execute
from atom_engine.sequence import StepOutput


class OverlappedSteps:
    def __init__(self, batcher: Batcher, runner: Runner) -> None:
        self.batcher, self.runner = batcher, runner
        self._host = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="atom-outputs")
        self._applied: list[Pending] = []  # the last step, applied; its outputs not made yet

    @property
    def holding(self) -> bool:
        """A step was applied whose outputs are still to be made (the next call returns them)."""
        return bool(self._applied)

    def step(self) -> list[StepOutput]:
        plan = self.batcher.schedule()
        applied, self._applied = self._applied, []
        if not plan.runs_forward:  # nothing to overlap with: the outputs now, then the plan's own news
            outs = self.batcher.process(applied)
            return outs + self.batcher.process(self.batcher.apply(plan, execute(self.runner, plan)))
        made = self._host.submit(self.batcher.process, applied, step_running=True) if applied else None
        result = execute(self.runner, plan)
        outs = made.result() if made is not None else []  # a bug in process ends the loop, as serially
        self._applied = self.batcher.apply(plan, result)
        return outs

    def close(self) -> None:
        self._host.shutdown(wait=True)
