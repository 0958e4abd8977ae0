"""The atom backend on the fake RBLN SDK (tests/fakes/rebel, written from Rebellions' call sites): compiled shapes,
token-exact against the cpu backend, KV that lives on the device, several devices, and refusals at start."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from atom_engine.backends.devices import visible_devices
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings

SETTINGS = dict(lanes=3, kv_blocks=6, max_seq_len=256, prefill_chunk=64, prefix_cache=True)
LONG = "a prompt longer than one prefill chunk of sixty-four tokens, so that it is prefilled in three chunks."
PROMPTS = ["the quick brown fox", "the quick brown cat", "jumps", LONG + " twice over", "the quick",
           LONG + " and once more"]


def test_compiled_shapes_match_lanes_kv_blocks_max_seq_len_and_chunk(rebel) -> None:  # noqa: ANN001
    engine = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    cfg = engine.model.cfg
    assert len(rebel.COMPILED) == 6
    prefill, decode, copy, export, imp, prefill_all = (c.shapes() for c in rebel.COMPILED)
    kv = (cfg.num_layers, 6, cfg.num_kv_heads, 256, cfg.head_dim)
    fwd = {"past_key_values_k": kv, "past_key_values_v": kv}
    assert prefill == {"input_ids": (1, 64), "positions": (1, 64), "slot_blocks": (1, 64), "attn_blocks": (1,),
                       "logits_index": (1,), **fwd}
    assert decode == {"input_ids": (3, 1), "positions": (3, 1), "slot_blocks": (3, 1), "attn_blocks": (3,),
                      "logits_index": (3,), **fwd}
    assert copy == {"src": (1,), "dst": (1,), **fwd}
    window = (2, cfg.num_layers, cfg.num_kv_heads, 64, cfg.head_dim)
    assert export == {"block": (1,), "positions": (64,), **fwd}
    assert imp == {"slot_blocks": (64,), "positions": (64,), "kv": window, **fwd}
    assert prefill_all == {**prefill, "logits_index": (1, 64)}  # every token's logits (prompt logprobs)
    # One compile context for the model: every graph shares its KV buffers and its weights.
    assert len({c.ctx_uid for c in rebel.COMPILED}) == 1 and all(c.weight_sharing for c in rebel.COMPILED)
    assert all(set(c.static) == set(fwd) for c in rebel.COMPILED)


def test_atom_outputs_equal_cpu_outputs_with_prefill_chunks_and_prefix_hits(rebel) -> None:  # noqa: ANN001
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    atom = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    got = atom.generate(PROMPTS, params)
    cpu = LLMEngine(EngineSettings(backend="cpu", **SETTINGS)).generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in cpu]
    assert atom.stats()["prefix_cache_hits"] >= 1  # the copy graph ran too
    b = atom.runner.backend
    assert b.prefill_rt.calls > len(PROMPTS)  # the long prompts took several chunks
    assert all(rt.calls > 0 for rt in (b.prefill_rt, b.decode_rt, b.copy_rt))
    atom.kv.check_invariant()


def test_the_kv_lives_on_the_device_and_moves_only_through_graphs(rebel) -> None:  # noqa: ANN001
    a = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    assert not hasattr(a.runner, "k_cache") and not hasattr(a.runner.backend, "k_cache")  # no host copy to slice
    out = a.generate([LONG], SamplingParams(max_tokens=3))[0]
    block = a.kv.cache[tuple(out.prompt_token_ids + out.token_ids[:-1])]
    n = len(out.prompt_token_ids)
    k, v = a.runner.export_kv(block, 0, n)  # three windows of the export graph
    assert k.shape == (a.model.cfg.num_layers, a.model.cfg.num_kv_heads, n, a.model.cfg.head_dim)
    assert k.dtype == a.model.dtype and bool((k[:, :, -1] != 0).any()) and bool((v[:, :, 0] != 0).any())
    cpu = LLMEngine(EngineSettings(backend="cpu", **SETTINGS))
    cpu_out = cpu.generate([LONG], SamplingParams(max_tokens=3))[0]
    ck, cv = cpu.runner.export_kv(cpu.kv.cache[tuple(cpu_out.prompt_token_ids + cpu_out.token_ids[:-1])], 0, n)
    torch.testing.assert_close(k, ck, rtol=1e-5, atol=1e-5)  # what the device computed, not zeros
    torch.testing.assert_close(v, cv, rtol=1e-5, atol=1e-5)
    a.runner.import_kv(4, 10, k[:, :, 10:], v[:, :, 10:])  # a window that starts mid-block
    k2, v2 = a.runner.export_kv(4, 10, n)
    assert torch.equal(k2, k[:, :, 10:]) and torch.equal(v2, v[:, :, 10:])
    with pytest.raises(ValueError, match=r"imported k is .* this engine takes"):
        a.runner.import_kv(4, 0, k.to(torch.float16), v)
    with pytest.raises(ValueError, match="outside kvBlocks=6"):
        a.runner.export_kv(6, 0, 1)


def test_fake_runtime_refuses_other_shapes_dtypes_and_blocks(rebel) -> None:  # noqa: ANN001
    engine = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    b = engine.runner.backend
    ok = [torch.zeros(1, 64, dtype=torch.long)] * 3 + [torch.zeros(1, dtype=torch.long)] * 2
    b.prefill_rt(*ok)  # the compiled call runs: non-static inputs only
    with pytest.raises(rebel.RBLNRuntimeError, match=r"shape \(1, 65\); the graph was compiled for \(1, 64\)"):
        b.prefill_rt(torch.zeros(1, 65, dtype=torch.long), *ok[1:])
    with pytest.raises(rebel.RBLNRuntimeError, match="dtype torch.int32"):
        b.prefill_rt(torch.zeros(1, 64, dtype=torch.int32), *ok[1:])
    with pytest.raises(rebel.RBLNRuntimeError, match="faulted on the device"):
        b.copy_rt(torch.tensor([1]), torch.tensor([6]))  # kvBlocks is 6
    with pytest.raises(rebel.RBLNRuntimeError, match="faulted on the device"):
        b.prefill_rt(ok[0], torch.full((1, 64), 256), *ok[2:])  # maxSeqLen is 256
    with pytest.raises(rebel.RBLNRuntimeError, match="takes 5 inputs .*; got 7"):
        b.prefill_rt(*ok, torch.zeros(1), torch.zeros(1))  # KV as arguments: the old backend's call


def test_prefill_chunk_must_be_a_multiple_of_64_on_atom(rebel) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="prefillChunk must be a positive multiple of 64 .* got 32"):
        LLMEngine(EngineSettings(backend="atom", **{**SETTINGS, "prefill_chunk": 32}))
    assert rebel.COMPILED == []


def test_a_model_that_does_not_fit_is_refused_at_start_with_the_bytes(rebel) -> None:  # noqa: ANN001
    big = dict(lanes=1, kv_blocks=4096, max_seq_len=8192, prefill_chunk=64, prefix_cache=False)
    with pytest.raises(ValueError, match=r"does not fit on 1 ATOM device\(s\): weights \d+ bytes \+ KV cache"
                       r" 17179869184 bytes = \d+ bytes needed; 16877879296 bytes available"):
        LLMEngine(EngineSettings(backend="atom", **big))
    assert rebel.COMPILED == []  # refused before compiling


def test_two_devices_from_the_visible_list(rebel, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("RBLN_VISIBLE_DEVICES", "2,3")
    caplog.set_level(logging.INFO, logger="atom_engine.devices")
    engine = LLMEngine(EngineSettings(backend="atom", num_devices=2, **SETTINGS))
    assert engine.runner.backend.decode_rt.devices == (2, 3)
    assert [r.message for r in caplog.records] == [
        "event=atom_devices num_devices=2 devices=2,3 source=RBLN_VISIBLE_DEVICES visible=2,3"]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    cpu = LLMEngine(EngineSettings(backend="cpu", **SETTINGS)).generate(PROMPTS[:3], params)
    assert [o.token_ids for o in engine.generate(PROMPTS[:3], params)] == [o.token_ids for o in cpu]
    assert rebel.device_bytes_in_use(2) == rebel.device_bytes_in_use(3) > 0  # spread over both cards
    monkeypatch.setenv("RBLN_VISIBLE_DEVICES", "2")
    with pytest.raises(ValueError, match=r"numDevices is 2 but only 1 ATOM device\(s\) are visible"
                       r" \(RBLN_VISIBLE_DEVICES: \[2\]\)"):
        LLMEngine(EngineSettings(backend="atom", num_devices=2, **SETTINGS))


def test_device_list_sources(tmp_path: Path) -> None:
    for name in ("rbln3", "rbln1", "rsd0", "rbln10", "null"):
        (tmp_path / name).touch()
    assert visible_devices(2, {"RBLN_VISIBLE_DEVICES": "5, 7"}, tmp_path) == [5, 7]
    env = {"RBLN_DEVICES": "4"}
    assert visible_devices(1, env, tmp_path) == [4] and env == {"RBLN_VISIBLE_DEVICES": "4"}  # the deprecated name
    env = {"RBLN_DEVICES": "4", "RBLN_VISIBLE_DEVICES": "6"}
    assert visible_devices(1, env, tmp_path) == [6] and env == {"RBLN_VISIBLE_DEVICES": "6"}  # as vllm-rbln: unset
    assert visible_devices(3, {}, tmp_path) == [1, 3, 10]
    assert visible_devices(2, {}, tmp_path) == [1, 3]
    assert visible_devices(2, {}, tmp_path / "absent") == [0, 1]
    with pytest.raises(ValueError, match=r"numDevices is 4 but only 3 ATOM device\(s\) are visible"):
        visible_devices(4, {}, tmp_path)


def test_atom_backend_without_the_sdk_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rebel", None)  # import rebel -> ImportError
    with pytest.raises(RuntimeError, match=r"the atom backend needs the RBLN SDK \(python package rebel-compiler\)"):
        LLMEngine(EngineSettings(backend="atom", **SETTINGS))


def test_cpu_backend_never_imports_rebel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rebel", None)
    LLMEngine(EngineSettings(backend="cpu", **SETTINGS)).generate(["x"], SamplingParams(max_tokens=2))


def test_every_token_logits_for_prompt_logprobs_equal_cpus(rebel) -> None:  # noqa: ANN001
    atom = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    cpu = LLMEngine(EngineSettings(backend="cpu", **SETTINGS))
    tokens = atom.encode(LONG)
    for start in (0, 64):
        piece = tokens[start : start + 64]
        got = atom.runner.prefill_logits(1, start, piece, every_token=True)
        want = cpu.runner.prefill_logits(1, start, piece, every_token=True)
        assert got.shape == want.shape == (len(piece), atom.vocab_size)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert atom.runner.backend.prefill_all_rt.calls == 2
