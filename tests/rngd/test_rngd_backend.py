"""The rngd prefill backend: compiled by the real furiosa-torch compiler (cached as an artifact), run on the fake
runtime, equal to the cpu backend's prefill (logits and the KV it ships); the fake refuses what the real runtime
refuses; the facts the fake copies from the real package are checked against the real package here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import furiosa_fake
import pytest
import torch
from atom_engine import artifacts
from atom_engine.backends.rngd import GRAPH_FILE
from atom_engine.pd.worker import PrefillWorker

from tests.rngd.conftest import rngd_settings

pytestmark = pytest.mark.timeout(3600)  # a cold artifact cache compiles first (minutes on two shared cores)
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
    assert graph["expectedNumFusion"] == 8  # one RNGD, all its 8 PEs fused into one device
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
            assert int(got.logits.argmax()) == int(want.logits.argmax())


def compiled_parts() -> tuple[object, object, list[torch.Tensor]]:
    backend = worker("float32").runner.backend
    module = backend.module
    args = [torch.zeros(1, 16, dtype=torch.long)] * 3 + [torch.zeros(1, dtype=torch.long)] * 2
    kv = [torch.zeros(backend.kv_shape) for _ in range(4)]
    return module.compiled, module.program, [*args, *kv]


def test_the_fake_refuses_what_the_runtime_refuses() -> None:
    compiled, program, host = compiled_parts()
    rt = furiosa_fake.Runtime()
    rt.set_fusion(8)
    unloaded = rt.module(compiled, program)
    dev = [rt.to_device(t, "furiosa:0") for t in host]
    with pytest.raises(ValueError, match="Runnable is not loaded"):
        unloaded(*dev)
    loaded = rt.module(compiled, program).to("furiosa:0")
    loaded(*dev)  # the compiled call runs
    with pytest.raises(RuntimeError, match="inputs must be placed in Furiosa device, but cpu"):
        loaded(*host)
    with pytest.raises(ValueError, match="Given arguments don't match expected argument spec"):
        loaded(*dev[:-1])
    with pytest.raises(RuntimeError, match=r"input 0 is torch.int64 \(1, 17\); the Runnable was compiled for"):
        loaded(rt.to_device(torch.zeros(1, 17, dtype=torch.long), "furiosa:0"), *dev[1:])
    with pytest.raises(RuntimeError, match="input 1 is torch.int32"):
        loaded(dev[0], rt.to_device(torch.zeros(1, 16, dtype=torch.int32), "furiosa:0"), *dev[2:])
    with pytest.raises(RuntimeError, match="num_fusion is already set"):
        rt.set_fusion(4)
    other = furiosa_fake.Runtime()
    other.set_fusion(4)  # another process that fused 4 PEs
    with pytest.raises(RuntimeError, match=r"Expected device fusion of compiled Runnable doesn't match current"
                                           r" device fusion \(8 != 4\)"):
        other.module(compiled, program).to("furiosa:0")(*[other.to_device(t, "furiosa:0") for t in host])


def test_device_kv_is_read_only_by_an_explicit_copy() -> None:
    backend = worker("float32").runner.backend
    k0 = backend.kv[0]
    for touch in (lambda: k0 + 1, lambda: torch.sum(k0), lambda: k0.numpy(), lambda: bool(k0), lambda: k0.tolist()):
        with pytest.raises(RuntimeError, match=r"explicit copy \(\.cpu\(\)\)"):
            touch()
    assert isinstance(k0[1, :, 0:3].cpu(), torch.Tensor)  # a device-side slice, then .cpu(): the export path
    k, v = backend.export_kv(1, 0, 3)
    assert k.shape == (2, 2, 3, 16) and k.dtype == torch.float32


def test_no_device_and_too_little_memory_fail_at_the_first_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, program, _ = compiled_parts()
    monkeypatch.setenv("ATOM_FAKE_RNGD_DEVICES", "0")  # no driver: import and is_available() work, memory does not
    with pytest.raises(torch.OutOfMemoryError, match="failed to allocate 16 bytes"):
        furiosa_fake.Runtime().zeros((4,), torch.float32, "furiosa:0")
    with pytest.raises(RuntimeError, match=r"needs 1 RNGD \(numDevices\) but furiosa_smi.list_devices\(\) finds 0"):
        PrefillWorker(rngd_settings("float32"))
    monkeypatch.setenv("ATOM_FAKE_RNGD_DEVICES", "1")
    monkeypatch.setenv("ATOM_FAKE_RNGD_MEMORY_BYTES", "4096")  # smaller than the tiny model's weights
    rt = furiosa_fake.Runtime()
    rt.set_fusion(8)
    with pytest.raises(torch.OutOfMemoryError, match="failed to allocate"):
        rt.module(compiled, program).to("furiosa:0")


def test_the_fakes_rules_match_the_real_package_here() -> None:
    """What the fake copies from furiosa-torch, checked against furiosa-torch itself on this driverless host."""
    import furiosa.torch
    import furiosa_smi

    if furiosa_smi.list_devices():
        pytest.skip("a host with RNGD: these are the driverless host's facts")
    worker("float32")  # the backend fixed this process's fusion to 8
    assert furiosa.torch.get_fusion().num_fusion == 8
    furiosa.torch.set_fusion(8)  # the same value again is accepted
    with pytest.raises(RuntimeError, match="num_fusion is already set"):
        furiosa.torch.set_fusion(4)
    assert furiosa.torch.is_available()  # with no NPU at all
    with pytest.raises(torch.OutOfMemoryError, match="failed to allocate 16 bytes"):
        torch.zeros(4, device="furiosa:0")
    compiled, _, host = compiled_parts()
    with pytest.raises(ValueError, match="Runnable is not loaded"):
        compiled(*host)  # the real CompileModule, never moved to a device


def test_a_mismatching_artifact_is_refused(tmp_path: Path) -> None:
    w = worker("float32")
    art = artifacts.locate(w.settings)
    pinned = json.loads((art.path / artifacts.MANIFEST).read_text())
    pinned["sdk"] = {**pinned["sdk"], "version": "2026.3.0"}  # a volume compiled by another furiosa-torch
    (tmp_path / artifacts.MANIFEST).write_text(json.dumps(pinned))
    with pytest.raises(artifacts.ArtifactMismatch, match="artifact mismatch: sdk.version: artifact has 2026.3.0"):
        artifacts.locate(rngd_settings("float32", compile_cache_dir=str(tmp_path)))
