"""LLMEngine on builtin:tiny: the reference engine's cases, isolation, sampling and stats."""

from __future__ import annotations

import pytest
from atom_engine import limits
from atom_engine.engine import LLMEngine
from atom_engine.errors import RequestRejected
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings

PROMPT = "The scratch block pads empty lanes."


def engine(**kw) -> LLMEngine:
    return LLMEngine(EngineSettings(**{"max_seq_len": 128, "prefill_chunk": 16, **kw}))


def solo(prompt: str | list[int], params: SamplingParams) -> list[int]:
    """The request alone on a one-lane engine without a cache: what every other setup must reproduce."""
    return engine(lanes=1, kv_blocks=2, prefix_cache=False).generate([prompt], params)[0].token_ids


def test_kv_blocks_lanes_plus_one_with_prefix_cache_is_refused_at_construction() -> None:
    with pytest.raises(ValueError) as err:
        EngineSettings(lanes=3, kv_blocks=4, prefix_cache=True)
    rule = limits.violations(limits.EngineView(3, 4, True, True, False, 0), scope="engine")
    assert rule and rule[0] in str(err.value) and "decode.kvBlocks must be >= decode.lanes + 2 = 5" in str(err.value)
    unchecked = EngineSettings.model_construct(**{**EngineSettings().model_dump(), "lanes": 3, "kv_blocks": 4})
    with pytest.raises(ValueError, match="decode.kvBlocks must be >= decode.lanes \\+ 2 = 5"):
        LLMEngine(unchecked)


def test_one_lane_two_blocks_without_cache_serves_the_same_prompt_twice_exactly() -> None:
    e = engine(lanes=1, kv_blocks=2, prefix_cache=False)
    first, second = e.generate([PROMPT, PROMPT], SamplingParams(max_tokens=12))
    assert first.token_ids == second.token_ids and len(first.token_ids) == 12
    assert e.stats()["prefill_tokens_computed"] == 2 * len(first.prompt_token_ids)
    e.kv.check_invariant()


def test_lanes_plus_two_same_prompt_twice_hits_the_cache_and_prefills_only_the_rest() -> None:
    e = engine(lanes=2, kv_blocks=4, prefix_cache=True)
    params = SamplingParams(max_tokens=12)
    first = e.generate([PROMPT], params)[0]
    computed = e.stats()["prefill_tokens_computed"]
    second = e.generate([PROMPT], params)[0]
    n = len(first.prompt_token_ids)
    assert second.token_ids == first.token_ids
    assert second.cached_tokens == n - 1  # all but the last prompt token, whose logits are needed
    assert e.stats()["prefill_tokens_computed"] - computed == 1
    assert e.stats()["prefix_cache_hits"] == 1
    e.kv.check_invariant()


def test_outputs_do_not_depend_on_lanes_or_prefix_cache() -> None:
    prompts = [PROMPT, PROMPT + " Yes.", "short", "x" * 70, PROMPT[:10]]
    params = SamplingParams(max_tokens=9)
    want = [solo(p, params) for p in prompts]
    for lanes, cache in [(4, True), (2, False), (3, True)]:
        e = engine(lanes=lanes, kv_blocks=limits.min_kv_blocks(lanes, cache), prefix_cache=cache)
        assert [o.token_ids for o in e.generate(prompts, params)] == want, (lanes, cache)
        e.kv.check_invariant()


def test_injected_fault_cancel_and_overlong_request_leave_the_others_exact() -> None:
    e = engine(lanes=3, kv_blocks=5, prefix_cache=True)
    params = SamplingParams(max_tokens=10)
    good_prompts = ["alpha beta", "gamma", PROMPT]
    want = [solo(p, params) for p in good_prompts]
    with pytest.raises(RequestRejected, match="maximum context length is 128 tokens; the prompt has 120 tokens and"
                                              " max_tokens is 10"):
        e.add_request([1] * 120, params)
    bad = e.add_request("poison", params)
    victim = e.add_request("cancel me", SamplingParams(max_tokens=30))
    good = [e.add_request(p, params) for p in good_prompts]
    real_decode = e.runner.decode

    def faulty(batch):  # noqa: ANN001, ANN202
        if any(s is bad for s in batch) and len(bad.output) >= 3:
            raise RuntimeError("injected device fault")
        return real_decode(batch)

    e.runner.decode = faulty
    for _ in range(200):
        if not e.has_unfinished():
            break
        e.step()
        e.kv.check_invariant()
        if len(victim.output) == 4:
            e.cancel(victim.id)
    assert bad.finish_reason == "error" and "injected device fault" in bad.error and len(bad.output) == 3
    assert victim.finish_reason == "cancelled" and len(victim.output) < 30
    assert [s.token_ids for s in map(e.output, good)] == want
    assert all(s.finish_reason == "length" for s in good)
    assert e.stats()["lane_blocks"] == 0


def test_seeded_sampling_is_reproducible_and_independent_of_batching() -> None:
    params = SamplingParams(max_tokens=12, temperature=0.8, top_k=40, top_p=0.9, seed=1234)
    alone = solo("sample me", params)
    e = engine(lanes=3, kv_blocks=5)
    outs = e.generate(["other one", "sample me", "third"], [SamplingParams(max_tokens=5), params,
                                                            SamplingParams(max_tokens=7, temperature=1.0, seed=1)])
    assert outs[1].token_ids == alone
    assert solo("sample me", SamplingParams(max_tokens=12, temperature=0.8, seed=99)) != alone


def test_top_k_one_is_greedy() -> None:
    assert solo(PROMPT, SamplingParams(max_tokens=8, temperature=1.0, top_k=1)) == solo(
        PROMPT, SamplingParams(max_tokens=8))


def test_stop_string_cuts_the_text() -> None:
    full = engine(lanes=1, kv_blocks=2, prefix_cache=False).generate([PROMPT], SamplingParams(max_tokens=20))[0]
    stop = next(ch for ch in full.text[2:] if ch.isprintable() and ch.strip())
    out = engine(lanes=1, kv_blocks=2, prefix_cache=False).generate([PROMPT], SamplingParams(max_tokens=20,
                                                                                             stop=(stop,)))[0]
    assert out.finish_reason == "stop" and out.text == full.text[: full.text.index(stop)]


def test_token_ids_outside_the_vocabulary_are_refused() -> None:
    e = engine(lanes=1, kv_blocks=3)
    with pytest.raises(RequestRejected, match=r"token ids must be in \[0, 320\)"):
        e.add_request([5, 320])


def test_stats_account_for_every_block_and_token() -> None:
    e = engine(lanes=2, kv_blocks=4)
    outs = e.generate([PROMPT, PROMPT, "abc"], SamplingParams(max_tokens=5))
    s = e.stats()
    assert s["free_blocks"] + s["lane_blocks"] + s["cached_blocks"] + 1 == s["kv_blocks"]
    assert s["prompt_tokens"] == sum(len(o.prompt_token_ids) for o in outs)
    assert s["generation_tokens"] == 15
    assert s["prefill_tokens_computed"] + s["cached_prompt_tokens"] == s["prompt_tokens"]
    assert s["requests_finished"] == 3
