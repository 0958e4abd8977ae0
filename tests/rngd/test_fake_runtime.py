"""The fake furiosa runtime refuses what the real one refuses, on a Runnable the real compiler compiled here (a
small graph with the prefill graph's traits: a KV-like input written in place by a flat index_copy_, and an
output), and the rules it copies from furiosa-torch hold for furiosa-torch itself on this driverless host."""

from __future__ import annotations

import furiosa_fake
import pytest
import torch

from tests.rngd.conftest import RNGD_PES

pytestmark = pytest.mark.timeout(900)
PES = RNGD_PES  # the rngd backend tests' fusion: one pytest process fixes its fusion once, for every test


class Step(torch.nn.Module):
    def forward(self, x: torch.Tensor, cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        cache.view(-1, 8).index_copy_(0, rows, x)
        return x * 2 + 1


def host_args() -> list[torch.Tensor]:
    return [torch.ones(4, 8), torch.zeros(2, 4, 8), torch.tensor([0, 2, 4, 6])]


@pytest.fixture(scope="module")
def compiled():  # noqa: ANN201 - (furiosa.torch.CompileModule, the exported program)
    import furiosa.torch as ft

    ft.set_fusion(PES)
    with torch.no_grad():
        exported = torch.export.export(Step(), tuple(host_args()), strict=False)
    program = exported.module()
    from atom_engine.backends.rngd import compile_uncached
    from furiosa.torch.export.exported_program import preprocess_exported_program

    pre, reconstructor = preprocess_exported_program(exported)  # CompileModule.from_exported, uncached
    module = ft.CompileModule(ft.Runnable(compile_uncached(ft, pre)), ft.export.ExportedProgramWeight(pre),
                              reconstructor)
    assert module.runnable._inner.expected_num_fusion == PES
    return module, program


def test_a_loaded_module_runs_and_writes_its_device_input_in_place(compiled) -> None:  # noqa: ANN001
    module, program = compiled
    rt = furiosa_fake.Runtime()
    rt.set_fusion(PES)
    loaded = rt.module(module, program).to("furiosa:0")
    x, cache, rows = (rt.to_device(t, "furiosa:0") for t in host_args())
    out = loaded(x, cache, rows)
    assert torch.equal(out.cpu(), torch.full((4, 8), 3.0))
    assert cache.cpu().view(-1, 8)[[0, 2, 4, 6]].eq(1).all() and cache.cpu().sum() == 32  # in place, on the device


def test_the_fake_refuses_what_the_runtime_refuses(compiled) -> None:  # noqa: ANN001
    module, program = compiled
    rt = furiosa_fake.Runtime()
    rt.set_fusion(PES)
    dev = [rt.to_device(t, "furiosa:0") for t in host_args()]
    with pytest.raises(ValueError, match="Runnable is not loaded"):
        rt.module(module, program)(*dev)
    loaded = rt.module(module, program).to("furiosa:0")
    with pytest.raises(RuntimeError, match="inputs must be placed in Furiosa device, but cpu"):
        loaded(*host_args())
    with pytest.raises(ValueError, match="Given arguments don't match expected argument spec"):
        loaded(*dev[:-1])
    with pytest.raises(RuntimeError, match=r"input 0 is torch.float32 \(4, 9\); the Runnable was compiled for"):
        loaded(rt.to_device(torch.ones(4, 9), "furiosa:0"), *dev[1:])
    with pytest.raises(RuntimeError, match="input 2 is torch.int32"):
        loaded(*dev[:2], rt.to_device(torch.tensor([0, 2, 4, 6], dtype=torch.int32), "furiosa:0"))
    with pytest.raises(RuntimeError, match="num_fusion is already set"):
        rt.set_fusion(4)
    rt.set_fusion(PES)  # the same value again is fine
    other = furiosa_fake.Runtime()
    other.set_fusion(4)  # a process that fused 4 PEs
    with pytest.raises(RuntimeError, match=r"Expected device fusion of compiled Runnable doesn't match current"
                                           rf" device fusion \({PES} != 4\)"):
        other.module(module, program).to("furiosa:0")(*[other.to_device(t, "furiosa:0") for t in host_args()])


def test_device_memory_is_read_only_by_an_explicit_copy() -> None:
    rt = furiosa_fake.Runtime()
    kv = rt.zeros((2, 4, 6, 8), torch.float32, "furiosa:0")  # [blocks, kv_heads, positions, head_dim]
    for touch in (lambda: kv + 1, lambda: torch.sum(kv), lambda: kv.numpy(), lambda: bool(kv), lambda: kv.tolist()):
        with pytest.raises(RuntimeError, match=r"explicit copy \(\.cpu\(\)\)"):
            touch()
    part = kv[1, :, 0:3]  # a device-side view, then an explicit copy: how the backend exports KV
    part.copy_(torch.ones(4, 3, 8))
    assert part.cpu().sum() == 96 and kv.cpu().sum() == 96


def test_no_driver_or_too_little_memory_fails_at_the_first_allocation(compiled,  # noqa: ANN001
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    module, program = compiled
    monkeypatch.setenv("ATOM_FAKE_RNGD_DEVICES", "0")
    rt = furiosa_fake.Runtime()
    assert rt.list_devices() == []
    with pytest.raises(torch.OutOfMemoryError, match="failed to allocate 16 bytes"):
        rt.zeros((4,), torch.float32, "furiosa:0")
    monkeypatch.setenv("ATOM_FAKE_RNGD_DEVICES", "1")
    monkeypatch.setenv("ATOM_FAKE_RNGD_MEMORY_BYTES", "256")  # smaller than the binary
    small = furiosa_fake.Runtime()
    small.set_fusion(PES)
    with pytest.raises(torch.OutOfMemoryError, match="failed to allocate"):
        small.module(module, program).to("furiosa:0")
    assert small.allocated.get("furiosa:0", 0) == 0  # nothing held after the refusal


def test_the_fakes_rules_match_the_real_package_here(compiled) -> None:  # noqa: ANN001
    """What the fake copies from furiosa-torch, checked against furiosa-torch itself on this driverless host."""
    import furiosa.torch
    import furiosa_smi

    if furiosa_smi.list_devices():
        pytest.skip("a host with RNGD: these are the driverless host's facts")
    module, _ = compiled
    assert furiosa.torch.get_fusion().num_fusion == PES
    furiosa.torch.set_fusion(PES)  # the same value again is accepted
    with pytest.raises(RuntimeError, match="num_fusion is already set"):
        furiosa.torch.set_fusion(4)
    assert furiosa.torch.is_available()  # with no NPU at all
    # The size in the message is the driverless allocator's own (16 bytes on one machine, 4096 on another): the
    # fact the fake copies is the OutOfMemoryError and its wording, not a host's rounding.
    with pytest.raises(torch.OutOfMemoryError, match=r"failed to allocate \d+ bytes"):
        torch.zeros(4, device="furiosa:0")
    with pytest.raises(ValueError, match="Runnable is not loaded"):
        module(*host_args())  # the real CompileModule, never moved to a device
