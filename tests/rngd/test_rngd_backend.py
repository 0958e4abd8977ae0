"""The rngd prefill backend: the prefill graph compiled by the real furiosa-torch compiler (cached as an artifact),
run on the fake runtime, equal to the cpu backend's prefill (logits and the KV it ships); its KV is reached only by
explicit copies; readiness asks furiosa-smi."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from atom_engine import artifacts
from atom_engine.backends.rngd import GRAPH_FILE
from atom_engine.pd.worker import PrefillWorker

from tests.rngd.conftest import RNGD_PES, rngd_settings

pytestmark = [pytest.mark.timeout(3600), pytest.mark.rngd]  # a cold artifact cache compiles first (minutes)
PROMPTS = [list(range(30, 30 + 5)), list(range(100, 100 + 16)), list(range(7, 7 + 37))]  # < one, one, 3 chunks
workers: dict[str, PrefillWorker] = {}


def worker(dtype: str) -> PrefillWorker:
    """One rngd prefill worker per dtype for the module: its compile (or artifact load) is the slow part."""
    if dtype not in workers:
        workers[dtype] = PrefillWorker(rngd_settings(dtype))
    return workers[dtype]


@pytest.fixture(scope="module", autouse=True)
def _drop_workers() -> Iterator[None]:
    yield
    workers.clear()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_real_compiler_builds_the_prefill_artifact(dtype: str) -> None:
    w = worker(dtype)
    backend = w.runner.backend
    art = artifacts.locate(w.settings)
    assert art.manifest is not None, "the first start saved its artifact"
    m = art.manifest
    assert m["backend"] == "rngd" and m["dtype"] == dtype and m["sdk"]["name"] == "furiosa-torch"
    assert m["sdk"]["version"] == "2026.4.0" and m["kvBlocks"] == 2 and m["prefillChunk"] == 16
    [graph] = m["graphs"]
    assert graph["expectedNumFusion"] == RNGD_PES  # bound to the fusion set before the compile
    assert graph["inputInfo"][0] == [[1, 16], "int64"] and len(graph["inputInfo"]) == 5 + 2 * 2
    blob = (art.path / GRAPH_FILE).read_bytes()
    assert blob == backend.inner.serialize()


def test_a_restart_loads_the_artifact_and_never_compiles(caplog: pytest.LogCaptureFixture) -> None:
    first = worker("float32")
    with caplog.at_level("INFO", logger="atom_engine"):
        again = PrefillWorker(rngd_settings("float32"))
    assert not hasattr(again.runner.backend, "compile_seconds")
    assert "event=artifact_loaded" in caplog.text and "event=rngd_compiled" not in caplog.text
    ship, want = again.compute("r", PROMPTS[1], 0), first.compute("r", PROMPTS[1], 0)
    assert ship is not None and want is not None and torch.equal(ship.k, want.k)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rngd_ships_what_the_cpu_backend_ships(dtype: str) -> None:
    rngd = worker(dtype)
    cpu = PrefillWorker(rngd_settings(dtype, backend="cpu", compile_cache_dir=None))
    for tokens in PROMPTS:
        for start in (0, len(tokens) - 1):  # the whole prompt, and only its last token (a prefix-cache hit)
            got, want = rngd.compute("r", tokens, start), cpu.compute("r", tokens, start)
            assert got is not None and want is not None
            assert got.k.dtype == want.k.dtype == getattr(torch, dtype) and got.k.shape == want.k.shape
            scale = 1e-5 if dtype == "float32" else 2e-2
            for a, b in ((got.k, want.k), (got.v, want.v), (got.logits, want.logits)):
                torch.testing.assert_close(a.float(), b.float(), atol=scale * b.float().abs().max().item(), rtol=0)
            assert_same_token_or_a_tie(got.logits, want.logits)


def assert_same_token_or_a_tie(got: torch.Tensor, want: torch.Tensor) -> None:
    """The same greedy token, unless the cpu backend scores both tokens equal to within one unit in the last place
    of the dtype (in bfloat16, prompt 0 of PROMPTS has two tokens at exactly 11.5 on the cpu backend; the rngd graph,
    which attends in float32 over the whole block, puts one of them 1 ulp higher)."""
    picked, expected = int(got.argmax()), int(want.argmax())
    if picked != expected:
        top = want[expected].float()
        ulp = torch.finfo(want.dtype).eps * top.abs()
        assert top - want[picked].float() <= ulp, (picked, expected, float(top), float(want[picked]))


def test_a_mismatching_artifact_is_refused(tmp_path: Path) -> None:
    w = worker("float32")
    art = artifacts.locate(w.settings)
    pinned = json.loads((art.path / artifacts.MANIFEST).read_text())
    pinned["sdk"] = {**pinned["sdk"], "version": "2026.3.0"}  # a volume compiled by another furiosa-torch
    (tmp_path / artifacts.MANIFEST).write_text(json.dumps(pinned))
    with pytest.raises(artifacts.ArtifactMismatch, match="artifact mismatch: sdk.version: artifact has 2026.3.0"):
        artifacts.locate(rngd_settings("float32", compile_cache_dir=str(tmp_path)))


def test_device_kv_is_read_only_by_an_explicit_copy() -> None:
    backend = worker("float32").runner.backend
    with pytest.raises(RuntimeError, match=r"explicit copy \(\.cpu\(\)\)"):
        torch.sum(backend.kv[0])
    k, v = backend.export_kv(1, 0, 3)  # device-side slices, then .cpu()
    assert k.shape == v.shape == (2, 2, 3, 16) and k.dtype == torch.float32


def test_a_host_without_rngd_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATOM_FAKE_RNGD_DEVICES", "0")  # is_available() would say True; furiosa-smi lists none
    with pytest.raises(RuntimeError, match=r"needs 1 RNGD \(numDevices\) but furiosa_smi.list_devices\(\) finds 0"):
        PrefillWorker(rngd_settings("float32"))
