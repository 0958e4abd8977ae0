"""Prefill chunks that ride in the decode step's forward (a runner that ``mixes_prefill``, as the cpu backend):
the same outputs as prefilling apart, every chunk in a mixed call, and faults isolated to their request."""

from __future__ import annotations

import dataclasses
import math

import pytest
from atom_engine import limits
from atom_engine.batcher import Batcher
from atom_engine.kv_blocks import KVBlocks
from atom_engine.sequence import SamplingParams

from tests.engine.fake_runner import MixingFakeRunner, echo_token, next_token, reference
from tests.engine.test_batcher import run

MAX_SEQ = 64


def make(lanes: int = 3, chunk: int = 4, speculative_tokens: int = 0, model=next_token) -> Batcher:  # noqa: ANN001
    kv_blocks = limits.min_kv_blocks(lanes, True) + 2
    runner = MixingFakeRunner(kv_blocks, MAX_SEQ, lanes, model=model)
    return Batcher(runner, KVBlocks(kv_blocks, prefix_cache=True), lanes=lanes, max_seq_len=MAX_SEQ,
                   prefill_chunk=chunk, speculative_tokens=speculative_tokens)


def all_blocks_back(b: Batcher) -> bool:
    return b.kv.counts() == {"free": b.kv.kv_blocks - 1 - len(b.kv.cache), "lanes": 0, "cached": len(b.kv.cache),
                             "scratch": 1}


@pytest.mark.parametrize("speculative_tokens", [0, 3])
@pytest.mark.parametrize("model", [next_token, echo_token])
def test_chunks_ride_in_the_decode_step_and_outputs_match_the_reference(speculative_tokens: int, model) -> None:  # noqa: ANN001
    b = make(speculative_tokens=speculative_tokens, model=model)
    # Prompts longer than the chunk (several rides each), a prompt that extends a finished one (a prefix-cache
    # hit: its ride starts past 0) and more requests than lanes (lanes refilled mid-run).
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [5, 5], [7, 8, 9, 1, 2, 3], [3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    seqs = [b.add(p, SamplingParams(max_tokens=6 + i)) for i, p in enumerate(prompts[:1])]
    run(b, seqs)
    seqs += [b.add(p, SamplingParams(max_tokens=6 + i)) for i, p in enumerate(prompts[1:], start=1)]
    run(b, seqs)
    for s in seqs:
        assert s.output == reference(s.prompt, len(s.output), model=model) and len(s.output) == s.params.max_tokens
    runner = b.runner
    assert runner.prefill_calls == [], "a chunk was prefilled on its own"
    ridden = sum(n for _, chunks in runner.mixed_calls for _, _, n in chunks)
    computed = sum(map(len, prompts)) - b.counters["cached_prompt_tokens"]
    assert ridden == b.counters["prefill_tokens_computed"] == computed
    assert b.counters["cached_prompt_tokens"] > 0  # the repeated prompt's prefix came from the cache
    # A chunk rides beside lanes that decode: the weights are read once for both.
    assert any(any(lanes) for lanes, _ in runner.mixed_calls)
    assert all_blocks_back(b)


def test_a_prompt_that_scores_itself_is_prefilled_on_its_own() -> None:
    b = make()
    scored = b.add([4, 3, 2], SamplingParams(max_tokens=3, prompt_logprobs=1))
    plain = b.add([4, 3, 1], SamplingParams(max_tokens=3))
    run(b, [scored, plain])
    assert [call[0] for call in b.runner.prefill_calls] == [scored.id]
    assert [q for _, chunks in b.runner.mixed_calls for q, _, _ in chunks] == [plain.id]
    assert plain.output == reference(plain.prompt, 3)


def test_fault_in_a_riding_chunk_fails_only_that_request() -> None:
    b = make(lanes=3)
    b.runner.fault = lambda s: s.prompt[0] == 99
    first = [b.add([i, i], SamplingParams(max_tokens=8)) for i in (1, 2)]
    b.step()  # the first two decode from here on
    bad = b.add([99, 1, 2, 3, 4, 5], SamplingParams(max_tokens=4))
    late = b.add([3, 1], SamplingParams(max_tokens=4))
    run(b, [*first, bad, late])
    assert bad.finish_reason == "error" and "injected fault" in bad.error and bad.output == []
    for s in [*first, late]:
        assert s.output == reference(s.prompt, s.params.max_tokens), s.id
    assert all_blocks_back(b)


def test_fault_in_a_decoding_lane_of_a_mixed_step_fails_only_that_lane() -> None:
    b = make(lanes=3)
    bad = b.add([1, 1], SamplingParams(max_tokens=8))
    good = b.add([2], SamplingParams(max_tokens=8))
    b.step()
    b.runner.fault = lambda s: s is bad  # mid-decode, while a new prompt rides in the same step
    rider = b.add([4, 5, 6], SamplingParams(max_tokens=5))
    run(b, [bad, good, rider])
    assert bad.finish_reason == "error" and 0 < len(bad.output) < 8
    assert good.output == reference(good.prompt, 8)
    assert rider.output == reference(rider.prompt, 5)
    assert all_blocks_back(b)


def same_up_to_rounding(a: object, b: object) -> bool:
    """Equal, but for floats within float32 rounding: a prefill chunk in the decode step's forward changes the
    matmuls' shapes, and CPU kernels need not sum in the same order for every shape (on some machines a logprob
    moved in its seventh digit). Token ids, ranks and lengths stay exact."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        return same_up_to_rounding(dataclasses.astuple(a), dataclasses.astuple(b))  # type: ignore[arg-type]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_up_to_rounding(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_up_to_rounding(a[k], b[k]) for k in a)
    return a == b


def test_the_torch_runner_gives_the_same_tokens_mixed_as_apart() -> None:
    """builtin:tiny on the cpu backend, more requests than lanes: greedy lanes with drafts, a seeded sampled lane,
    a logprobs lane, a prompt longer than the chunk, a prompt that scores itself (prefilled apart) and a prefix
    hit, with prefill chunks in the decode step's forward or on their own: the same tokens, and the same logprobs
    up to float32 rounding."""
    from atom_engine.engine import LLMEngine
    from atom_engine.settings import EngineSettings

    prompts = [[5, 6, 7] * 6, [9, 3, 9, 3, 9, 3, 1], [2, 4, 8, 16, 32], list(range(40, 80)), [11, 12, 11, 12, 11],
               [5, 6, 7] * 6 + [1, 2], [30, 31, 32]]
    params = [SamplingParams(max_tokens=20, ignore_eos=True), SamplingParams(max_tokens=12, ignore_eos=True),
              SamplingParams(max_tokens=16, temperature=0.9, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=10, ignore_eos=True),
              SamplingParams(max_tokens=14, logprobs=2, ignore_eos=True),
              SamplingParams(max_tokens=8, ignore_eos=True),
              SamplingParams(max_tokens=6, prompt_logprobs=1, ignore_eos=True)]

    def generate(mixes: bool) -> tuple[list, dict[str, int]]:
        engine = LLMEngine(EngineSettings(lanes=3, kv_blocks=8, max_seq_len=96, prefill_chunk=16,
                                          speculative_tokens=3))
        engine.batcher.mixes_prefill = mixes
        seqs = []
        for part in (slice(0, 1), slice(1, None)):  # the first ends before a prompt that extends it (a cache hit)
            seqs += [engine.add_request(p, sp) for p, sp in zip(prompts[part], params[part], strict=True)]
            while not all(s.finished for s in seqs):
                engine.step()
        return [(s.output, s.logprobs, s.prompt_logprobs) for s in seqs], dict(engine.batcher.counters)

    apart, _ = generate(False)
    mixed, counters = generate(True)
    assert [out for out, _, _ in mixed] == [out for out, _, _ in apart]  # the tokens, exactly
    assert same_up_to_rounding(mixed, apart), (mixed, apart)
    assert counters["cached_prompt_tokens"] > 0 and counters["draft_tokens"] > 0
