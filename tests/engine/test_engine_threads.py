"""The engine as a server drives it: steps in one worker thread, requests and cancels from another thread."""

from __future__ import annotations

import threading

import torch
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings


def test_worker_thread_steps_while_requests_and_cancels_arrive() -> None:
    e = LLMEngine(EngineSettings(lanes=2, kv_blocks=4, max_seq_len=128, prefill_chunk=16))
    params = SamplingParams(max_tokens=8)
    prompts = [f"request {i}" for i in range(6)]
    want = LLMEngine(EngineSettings(lanes=1, kv_blocks=2, prefix_cache=False, max_seq_len=128)).generate(
        prompts, params)
    done = threading.Event()
    streamed: dict[str, list[int]] = {}

    def worker() -> None:
        while not done.is_set() or e.has_unfinished():
            for out in e.step():
                streamed.setdefault(out.request_id, []).extend(out.new_tokens)

    t = threading.Thread(target=worker)
    t.start()
    seqs = [e.add_request(p, params) for p in prompts]
    doomed = e.add_request("cancel me", SamplingParams(max_tokens=100))
    e.cancel(doomed.id)
    done.set()
    t.join(timeout=120)
    assert not t.is_alive()
    assert [s.output for s in seqs] == [w.token_ids for w in want]
    assert [streamed[s.id] for s in seqs] == [s.output for s in seqs]  # the stream carries every token once
    assert doomed.finish_reason == "cancelled"
    e.kv.check_invariant()


def test_kv_export_and_import_between_engines_continue_exactly() -> None:
    """The hook PD disaggregation plugs into: a block's KV moved to another engine's block reads the same."""
    a = LLMEngine(EngineSettings(lanes=1, kv_blocks=3, max_seq_len=64))
    b = LLMEngine(EngineSettings(lanes=1, kv_blocks=3, max_seq_len=64))
    out = a.generate(["shipped prompt"], SamplingParams(max_tokens=3))[0]
    block = a.kv.cache[tuple(out.prompt_token_ids + out.token_ids[:-1])]
    n = len(out.prompt_token_ids)
    k, v = a.runner.export_kv(block, 0, n)
    assert k.abs().sum() > 0 and v.abs().sum() > 0  # the prompt's KV, not an empty block
    b.runner.import_kv(2, 0, k, v)
    k2, v2 = b.runner.export_kv(2, 0, n)
    assert torch.equal(k2, k) and torch.equal(v2, v)
