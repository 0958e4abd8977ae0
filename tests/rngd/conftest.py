"""The rngd tests run in .venv-rngd (furiosa-torch and the torch 2.10 it pins), not in the dev venv: make test runs
them in a second pytest (``--confcutdir tests/rngd``, so the dev suite's conftest and its packages stay out).

The compiler is real and slow (minutes per graph on two shared cores), so compiled artifacts are cached outside
the repo under ``$ATOM_RNGD_ARTIFACTS`` (default ``~/.cache/atom/rngd-artifacts``), keyed like every artifact by
the model, shapes, dtype, devices, the compiler's version and a hash of the graph's source: a warm run loads them.
The device runtime is the fake (``tests/fakes/furiosa_fake``): there is no RNGD or driver here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

FAKES = str(Path(__file__).resolve().parents[1] / "fakes")
ARTIFACTS = os.environ.get("ATOM_RNGD_ARTIFACTS", str(Path.home() / ".cache" / "atom" / "rngd-artifacts"))
sys.path.insert(0, FAKES)
os.environ["ATOM_RNGD_RUNTIME"] = "furiosa_fake"


# One PE: the device of a pod given one partition of a card (furiosa.ai/rngd-1core.6gb). The compiler's time grows
# with the fusion: this graph compiles in ~7 min at one PE on two loaded cores, and at a whole card's 8 PEs it had
# not finished after 60 min here, which no test run can carry.
RNGD_PES = 1


def rngd_settings(dtype: str = "float32", **extra: object):  # noqa: ANN201 - EngineSettings
    """A prefill worker's settings as the operator renders them (one lane, two blocks, no prefix cache) with the
    smallest honest shapes: builtin:tiny (2 layers, hidden 64), maxSeqLen 64, chunk 16, one PE."""
    from atom_engine.settings import EngineSettings

    return EngineSettings(**{**dict(model_source="builtin:tiny", backend="rngd", lanes=1, kv_blocks=2,
                                    prefix_cache=False, max_seq_len=64, prefill_chunk=16, dtype=dtype,
                                    rngd_pes=RNGD_PES, compile_cache_dir=ARTIFACTS), **extra})


@pytest.fixture(autouse=True)
def _fake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ATOM_FAKE_RNGD_DEVICES", "ATOM_FAKE_RNGD_MEMORY_BYTES"):
        monkeypatch.delenv(var, raising=False)
