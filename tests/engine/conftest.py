"""Engine tests share two cores with other work: one torch thread avoids spin-waiting on a busy machine."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tests that run the CLI in process size torch's threads from the allowance, as a pod's process does: the next
    test gets one thread again (row-count-dependent rounding with two threads would otherwise differ by test order)."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


FAKES = str(Path(__file__).resolve().parents[1] / "fakes")


@pytest.fixture
def rebel(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - the fake SDK module
    """The fake RBLN SDK (tests/fakes/rebel), freshly imported, with one fake ATOM unless a test says more."""
    monkeypatch.syspath_prepend(FAKES)
    for name in [m for m in sys.modules if m == "rebel" or m.startswith("rebel.")]:
        monkeypatch.delitem(sys.modules, name)
    for var in ("RBLN_VISIBLE_DEVICES", "RBLN_DEVICES", "REBEL_FAKE_NPUS"):
        monkeypatch.delenv(var, raising=False)
    import rebel

    return rebel
