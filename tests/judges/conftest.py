"""The outside judges (lm-eval, guidellm) run from their own cached venv (hack/judges-venv.sh) against engines
served as ``atom-engine serve`` subprocesses on the trained SmolLM2 checkpoint, with every hub access off."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from atom_engine.model.builtin import checkpoint_path

from tests.serving.conftest import REPO, Proc, spawn, wait_ready_sync

SOURCE = "builtin:smollm2-135m"
MODEL = "smollm2"
TASKS = Path(__file__).parent / "tasks"


@pytest.fixture(scope="session")
def judges_python() -> Path:
    """The judges' python (the venv is built once per machine, keyed by requirements/judges.lock)."""
    out = subprocess.run(["bash", "hack/judges-venv.sh"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    return Path(out.stdout.strip().splitlines()[-1])


def judge_env(tmp: Path) -> dict[str, str]:
    # No hub: the checkpoint and the task data are local files; caches go to the test's own directory.
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(tmp / "hf-home"), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "GUIDELLM__LOGGING__DISABLED": "true"}


@pytest.fixture(scope="session")
def checkpoint() -> Path:
    """SmolLM2-135M-Instruct as ``make model`` converted it (HF layout): the engines serve it as
    ``builtin:smollm2-135m`` and lm-eval's hf model and the judges' tokenizers load the same directory."""
    path = checkpoint_path(SOURCE)  # ValueError naming `make model` when it was not converted here
    assert path is not None
    return path


def engine_settings(checkpoint: Path, **extra: object) -> dict:
    return dict(model_name=MODEL, model_source=SOURCE, max_seq_len=256, prefill_chunk=64, **extra)


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Iterator[dict[str, Proc]]:
    """A standalone engine, and a decode engine with one prefill worker (remote-only PD)."""
    tmp = tmp_path_factory.mktemp("judged-engines")
    procs: dict[str, Proc] = {}
    try:
        procs["direct"] = spawn(tmp, "direct", "standalone", engine_settings(checkpoint, lanes=4, kv_blocks=6,
                                                                            prefix_cache=True))
        procs["prefill"] = spawn(tmp, "prefill", "prefill", engine_settings(checkpoint, lanes=1, kv_blocks=3,
                                                                           prefix_cache=True))
        wait_ready_sync(procs["prefill"])
        procs["pd"] = spawn(tmp, "pd", "decode", engine_settings(
            checkpoint, lanes=4, kv_blocks=6, prefix_cache=True, local_prefill=False,
            prefill_workers=procs["prefill"].address))
        for p in procs.values():
            wait_ready_sync(p)
        yield procs
    finally:
        for p in procs.values():
            p.kill()
