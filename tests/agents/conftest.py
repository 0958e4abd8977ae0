"""The agent frameworks run from their own cached venvs (hack/agents-venv.sh: openai-agents, pydantic-ai and
langchain-openai in one, instructor in another) against an ``atom-engine serve`` subprocess on the trained
SmolLM2 checkpoint, which calls tools through the engine's Hermes template (``smollm2-hermes``)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.judges.conftest import SOURCE, checkpoint, judge_env  # noqa: F401 - checkpoint is a fixture
from tests.serving.conftest import REPO, Proc, spawn, wait_ready_sync

MODEL = "smollm2"


@pytest.fixture(scope="session")
def framework_pythons() -> dict[str, Path]:
    """``agents`` and ``instructor``: each venv's python (built once per machine, keyed by its lock)."""
    out = subprocess.run(["bash", "hack/agents-venv.sh"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    agents, instructor = out.stdout.strip().splitlines()[-2:]
    return {"agents": Path(agents), "instructor": Path(instructor)}


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Iterator[Proc]:  # noqa: F811
    """A standalone engine with room for an agent's history (tools, calls and their results): 2048 tokens."""
    tmp = tmp_path_factory.mktemp("agents-engine")
    proc = spawn(tmp, "engine", "standalone", dict(model_name=MODEL, model_source=SOURCE, max_seq_len=2048,
                                                   prefill_chunk=256, lanes=2, kv_blocks=4, prefix_cache=True))
    try:
        wait_ready_sync(proc)
        yield proc
    finally:
        proc.kill()


def offline_env(tmp: Path) -> dict[str, str]:
    return {**judge_env(tmp), "OPENAI_AGENTS_DISABLE_TRACING": "1"}
