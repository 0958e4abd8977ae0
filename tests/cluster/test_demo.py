"""``make demo``, the README's first command, run as a newcomer runs it: the command itself, start to end.

It starts its own control plane and operator (the demo cleans up after itself), so it shares nothing with the
session's cluster; it needs what ``make test`` builds first (the venv, the pinned tools, the converted model).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]


def test_make_demo_answers_gives_a_structured_answer_and_calls_a_tool() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("PYTEST")}
    out = subprocess.run(["make", "demo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1100)
    shown = f"exit {out.returncode}\n--- stdout (tail)\n{out.stdout[-6000:]}\n--- stderr (tail)\n{out.stderr[-4000:]}"
    assert out.returncode == 0, shown
    steps = [line for line in out.stdout.splitlines() if line.startswith("[") and "] done in " in line]
    assert len(steps) == 9 and steps[-1].startswith("[9/9]"), shown
    assert "Paris" in out.stdout, shown
    assert "parsed: Capital(city=" in out.stdout, shown
    assert " calls get_weather({" in out.stdout, shown
    assert "[cleanup]" in out.stdout, shown
