"""A paced engine for tests: ``python -m tests.pacing serve ...`` is ``atom-engine serve ...`` whose runner takes at
least ``ATOM_TEST_PACE_PREFILL_MS_PER_TOKEN`` per prompt token and ``ATOM_TEST_PACE_DECODE_STEP_MS`` per decode
step, so a pod's capacity in a test is set by design, not by a shared CPU. The runner stand-in sleeps out what the
real forward left of its budget; nothing in the engine knows about it.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from atom_engine.runner import ModelRunner as Runner

PREFILL_ENV = "ATOM_TEST_PACE_PREFILL_MS_PER_TOKEN"
DECODE_ENV = "ATOM_TEST_PACE_DECODE_STEP_MS"


def _paced(method: Callable, budget: Callable[..., float]) -> Callable:
    @functools.wraps(method)
    def run(self: Runner, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        out = method(self, *args, **kwargs)
        left = budget(*args, **kwargs) - (time.perf_counter() - began)
        if left > 0:
            time.sleep(left)
        return out

    return run


def install(prefill_ms_per_token: float, decode_step_ms: float) -> None:
    """Pace every Runner of this process: prefill chunks (a worker's and a decode pod's local ones) by their
    tokens, decode and verify steps by the step."""
    if prefill_ms_per_token > 0:
        Runner.prefill_logits = _paced(Runner.prefill_logits, lambda _b, _s, tokens, *a, **k: len(tokens)
                                       * prefill_ms_per_token / 1000)  # fmt: skip
    if decode_step_ms > 0:
        for name in ("decode", "verify"):
            setattr(Runner, name, _paced(getattr(Runner, name), lambda *a, **k: decode_step_ms / 1000))


def env(prefill_ms_per_token: float = 0.0, decode_step_ms: float = 0.0) -> dict[str, str]:
    return {PREFILL_ENV: str(prefill_ms_per_token), DECODE_ENV: str(decode_step_ms)}


def main(argv: list[str] | None = None) -> int:
    install(float(os.environ.get(PREFILL_ENV, 0)), float(os.environ.get(DECODE_ENV, 0)))
    from atom_engine.cli import main as engine_main

    return engine_main(argv)


if __name__ == "__main__":
    from atom_engine.cli import exit_process

    exit_process(main())  # the engine's own way out (atom_engine.cli.entrypoint)
