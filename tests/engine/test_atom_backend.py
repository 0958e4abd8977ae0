"""The atom backend through a fake ``rebel`` that enforces the compiled static shapes and block indices."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings

FAKES = str(Path(__file__).resolve().parents[1] / "fakes")
SETTINGS = dict(lanes=3, kv_blocks=6, max_seq_len=64, prefill_chunk=16, prefix_cache=True)
PROMPTS = ["the quick brown fox", "the quick brown cat", "jumps", "over the lazy dog, twice over", "the quick"]


@pytest.fixture
def rebel(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.syspath_prepend(FAKES)
    monkeypatch.delitem(sys.modules, "rebel", raising=False)
    import rebel

    rebel.COMPILED.clear()
    return rebel


def test_compiled_shapes_match_lanes_kv_blocks_max_seq_len_and_chunk(rebel) -> None:  # noqa: ANN001
    engine = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    cfg = engine.model.cfg
    prefill, decode, copy = (c.shapes() for c in rebel.COMPILED)
    kv = (cfg.num_layers, 6, cfg.num_kv_heads, 64, cfg.head_dim)
    assert prefill == {"input_ids": (1, 16), "positions": (1, 16), "slot_blocks": (1, 16), "attn_blocks": (1,),
                       "logits_index": (1,), "k_cache": kv, "v_cache": kv}
    assert decode == {"input_ids": (3, 1), "positions": (3, 1), "slot_blocks": (3, 1), "attn_blocks": (3,),
                      "logits_index": (3,), "k_cache": kv, "v_cache": kv}
    assert copy == {"src": (1,), "dst": (1,), "k_cache": kv, "v_cache": kv}


def test_atom_outputs_equal_cpu_outputs(rebel) -> None:  # noqa: ANN001
    params = SamplingParams(max_tokens=10)
    atom = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    got = atom.generate(PROMPTS, params)
    cpu = LLMEngine(EngineSettings(backend="cpu", **SETTINGS)).generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in cpu]
    assert atom.stats()["prefix_cache_hits"] >= 1  # the copy graph ran too
    assert all(rt.calls > 0 for rt in (atom.runner.backend.prefill_rt, atom.runner.backend.decode_rt,
                                       atom.runner.backend.copy_rt))
    atom.kv.check_invariant()


def test_fake_runtime_refuses_other_shapes_dtypes_and_blocks(rebel) -> None:  # noqa: ANN001
    engine = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    b = engine.runner.backend
    k, v = engine.runner.k_cache, engine.runner.v_cache
    ok = [torch.zeros(1, 16, dtype=torch.long)] * 3 + [torch.zeros(1, dtype=torch.long)] * 2
    b.prefill_rt(*ok, k, v)  # the compiled call runs
    with pytest.raises(rebel.RBLNRuntimeError, match=r"shape \(1, 17\); the graph was compiled for \(1, 16\)"):
        b.prefill_rt(torch.zeros(1, 17, dtype=torch.long), *ok[1:], k, v)
    with pytest.raises(rebel.RBLNRuntimeError, match="dtype torch.int32"):
        b.prefill_rt(torch.zeros(1, 16, dtype=torch.int32), *ok[1:], k, v)
    with pytest.raises(rebel.RBLNRuntimeError, match="outside the compiled kv_blocks=6"):
        b.copy_rt(torch.tensor([1]), torch.tensor([6]), k, v)
    with pytest.raises(rebel.RBLNRuntimeError, match="outside the compiled max_seq_len=64"):
        b.prefill_rt(ok[0], torch.full((1, 16), 64), *ok[2:], k, v)
    with pytest.raises(rebel.RBLNRuntimeError, match="static-address input"):
        b.prefill_rt(*ok, k.clone(), v)


def test_atom_backend_without_the_sdk_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rebel", None)  # import rebel -> ImportError
    with pytest.raises(RuntimeError, match=r"the atom backend needs the RBLN SDK \(python package rebel-compiler\)"):
        LLMEngine(EngineSettings(backend="atom", **SETTINGS))


def test_cpu_backend_never_imports_rebel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rebel", None)
    LLMEngine(EngineSettings(backend="cpu", **SETTINGS)).generate(["x"], SamplingParams(max_tokens=2))
