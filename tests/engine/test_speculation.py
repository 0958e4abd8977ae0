"""Prompt-lookup speculation: the n-gram index, and the batcher verifying drafts against a fake model (the same
output as one-token steps, in fewer steps; stops, limits, sampling and faults as without drafts)."""

from __future__ import annotations

import random

import pytest
from atom_engine import limits
from atom_engine.batcher import Batcher
from atom_engine.kv_blocks import KVBlocks
from atom_engine.sequence import FinishReason, SamplingParams, Sequence
from atom_engine.speculation import NGRAM_MAX, NGRAM_MIN, REACH_GROW, REACH_START, Drafter, PromptLookup

from tests.engine.fake_runner import FakeRunner, echo_token, next_token, reference

MAX_SEQ = 64


def scan(context: list[int], k: int) -> list[int]:
    """The rule PromptLookup indexes, by brute force: the tokens after the latest earlier occurrence of the
    longest recurring suffix n-gram, copied one by one from the text as it grows by the copy itself."""
    for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
        if len(context) <= n:
            continue
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == context[-n:]:
                grown = list(context)
                for i in range(k):
                    grown.append(grown[start + n + i])
                return grown[len(context) :]
    return []


def test_lookup_proposes_what_followed_the_latest_occurrence_of_the_longest_suffix() -> None:
    lookup = PromptLookup()
    #          0  1  2  3  4  5  6  7  8
    prompt = [5, 6, 7, 1, 9, 6, 7, 2, 3]
    assert lookup.propose(prompt, [6, 7], 3) == [2, 3, 6]  # "6 7" last seen at 5..6, then 2 3 6(output)
    assert lookup.propose(prompt, [6, 7, 2], 2) == [3, 6]  # "6 7 2" (n=3) beats the newer "2" alone
    assert lookup.propose(prompt, [8], 4) == []  # 8 never occurred before
    assert lookup.propose([1, 2, 3], [], 2) == []  # nothing recurs: never a match with itself
    assert lookup.propose(prompt, [8], 0) == []


def test_a_copy_that_reaches_the_end_goes_on_with_the_period_it_found() -> None:
    # "1 2" last seen 2 tokens back: the text after it is "1 2", and if the text repeats, then "1 2 1 ...".
    assert PromptLookup().propose([4, 1, 2, 1, 2], [], 5) == [1, 2, 1, 2, 1]
    assert PromptLookup().propose([7, 7], [7], 3) == [7, 7, 7]  # period 1
    assert PromptLookup().propose([4, 1, 2, 1, 2], [], 1) == [1]  # no further than k


def test_a_drafts_reach_grows_while_kept_and_shrinks_when_not() -> None:
    text = [1, 2, 3] * 6  # any reach finds a draft of that length
    drafter = Drafter()
    assert len(drafter.draft(text, [], 7)) == REACH_START
    drafter.kept(REACH_START, REACH_START)  # kept whole: grows
    assert len(drafter.draft(text, [], 7)) == REACH_START + REACH_GROW
    drafter.kept(4, 1)  # a miss: one less than was drafted
    assert len(drafter.draft(text, [], 7)) == 3
    for drafted in (3, 2, 1, 1):
        drafter.kept(drafted, 0)
    assert len(drafter.draft(text, [], 7)) == 1  # never below one token
    drafter.kept(0, 0)  # no draft this step (nothing recurred): says nothing about the reach
    assert drafter.reach == 1
    for _ in range(5):
        drafted = len(drafter.draft(text, [], 7))
        drafter.kept(drafted, drafted)
    assert len(drafter.draft(text, [], 7)) == 7  # the cap holds ...
    assert drafter.reach == 7 + REACH_GROW  # ... and the reach stays near it, so a miss brings it under
    drafter.kept(7, 6)
    assert len(drafter.draft(text, [], 7)) == 6


def test_lookup_indexed_a_step_at_a_time_agrees_with_a_full_scan() -> None:
    rng = random.Random(7)
    for _ in range(200):
        prompt = [rng.randrange(5) for _ in range(rng.randrange(1, 20))]
        output: list[int] = []
        lookup = PromptLookup()
        for _ in range(30):
            k = rng.randrange(0, 5)
            assert lookup.propose(prompt, output, k) == (scan(prompt + output, k) if k else [])
            output += [rng.randrange(5) for _ in range(rng.randrange(1, 3))]


def make(lanes: int = 2, model=next_token, speculative_tokens: int = 3, **kw) -> Batcher:  # noqa: ANN001
    kv_blocks = limits.min_kv_blocks(lanes, True)
    runner = FakeRunner(kv_blocks, MAX_SEQ, lanes, model=model)
    return Batcher(runner, KVBlocks(kv_blocks, prefix_cache=True), lanes=lanes, max_seq_len=MAX_SEQ, prefill_chunk=4,
                   speculative_tokens=speculative_tokens, **kw)


def run(b: Batcher, seqs: list[Sequence]) -> None:
    for _ in range(500):
        if all(s.finished for s in seqs):
            return
        b.step()
        b.kv.check_invariant()
    raise AssertionError("requests did not finish")


PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7], [9, 9, 9], [3, 1, 4, 1, 5, 9, 2, 6], [7]]


@pytest.mark.parametrize("model", [echo_token, next_token], ids=["repetitive", "hash"])
@pytest.mark.parametrize("k", [1, 3, limits.SPECULATIVE_TOKENS_MAX])
def test_outputs_are_those_of_one_token_steps(model, k: int) -> None:  # noqa: ANN001
    b = make(model=model, speculative_tokens=k)
    seqs = [b.add(p, SamplingParams(max_tokens=12 + i)) for i, p in enumerate(PROMPTS)]
    run(b, seqs)
    for seq, p in zip(seqs, PROMPTS, strict=True):
        assert seq.output == reference(p, len(seq.output), model=model)
        assert len(seq.output) == seq.params.max_tokens and seq.finish_reason is FinishReason.LENGTH
    c = b.counters
    assert c["generation_tokens"] == sum(len(s.output) for s in seqs)
    assert b.runner.verify_calls, "no step carried a draft"
    if model is echo_token:  # the fake repeats itself: drafts are right and steps are saved
        assert c["draft_tokens_accepted"] > c["draft_tokens"] // 2
        assert c["decode_steps"] < c["generation_tokens"] - len(seqs)
    assert all(len(d) <= k for call in b.runner.verify_calls for d in call)
    if model is next_token and k == limits.SPECULATIVE_TOKENS_MAX:  # drafts of the hash fake miss: they shrink
        assert c["draft_tokens"] < 2 * sum(map(len, b.runner.verify_calls)), "missed drafts did not shrink"


def test_no_draft_runs_past_max_tokens_or_the_block() -> None:
    # prompt + max_tokens == maxSeqLen: a draft reaching past max_tokens would write past the block (IndexError).
    b = make(model=echo_token, speculative_tokens=limits.SPECULATIVE_TOKENS_MAX)
    prompt = [1, 2, 3] * 4
    seq = b.add(prompt, SamplingParams(max_tokens=MAX_SEQ - len(prompt)))
    run(b, [seq])
    assert seq.output == reference(prompt, MAX_SEQ - len(prompt), model=echo_token)


def test_a_stop_inside_an_accepted_draft_ends_there() -> None:
    b = make(model=echo_token, speculative_tokens=limits.SPECULATIVE_TOKENS_MAX)
    # The echo model continues 8 5 6 8 5 6 ...; from the second step the whole draft is right, and 5 stops it.
    cut = b.add([5, 6, 8, 5, 6], SamplingParams(max_tokens=30, stop_token_ids=(5,)))
    run(b, [cut])
    assert cut.output == [8, 5] and cut.finish_reason is FinishReason.STOP
    assert b.runner.verify_calls[0][0] == [5, 6]  # it was fed past the stop, which is then dropped
    assert b.kv.stats()["lane_blocks"] == 0
    again = b.add([5, 6, 8, 5, 6], SamplingParams(max_tokens=30))  # a prefix-cache hit on what was kept
    run(b, [again])
    assert again.output == reference(again.prompt, 30, model=echo_token)


def test_sampled_and_logit_shaping_requests_get_no_draft() -> None:
    b = make(model=echo_token, lanes=3)
    greedy = b.add([1, 2, 3, 1, 2], SamplingParams(max_tokens=10))
    sampled = b.add([1, 2, 3, 1, 2], SamplingParams(max_tokens=10, temperature=0.8, seed=1))
    penalised = b.add([1, 2, 3, 1, 2], SamplingParams(max_tokens=10, repetition_penalty=1.2))
    run(b, [greedy, sampled, penalised])  # the fake's verify asserts no draft reaches a non-greedy lane
    for call in b.runner.verify_calls:
        assert call[1] == [] and call[2] == []
    assert any(call[0] for call in b.runner.verify_calls)
    assert greedy.output == reference(greedy.prompt, 10, model=echo_token)


def test_off_feeds_no_draft() -> None:
    b = make(model=echo_token, speculative_tokens=0)
    seqs = [b.add(p, SamplingParams(max_tokens=10)) for p in PROMPTS]
    run(b, seqs)
    assert b.runner.verify_calls == [] and b.counters["draft_tokens"] == 0
    assert b.counters["decode_steps"] >= 9


def test_a_fault_in_a_speculative_step_fails_only_its_request() -> None:
    b = make(model=echo_token, lanes=2)
    bad = b.add([1, 2, 3, 1, 2], SamplingParams(max_tokens=10))
    good = b.add([4, 5, 6, 4, 5], SamplingParams(max_tokens=10))
    b.runner.fault = lambda seq: seq is bad and len(seq.output) >= 2
    run(b, [bad, good])
    assert bad.finish_reason is FinishReason.ERROR and "injected fault" in (bad.error or "")
    assert good.output == reference(good.prompt, 10, model=echo_token)
    assert b.kv.stats()["lane_blocks"] == 0


def test_the_torch_runner_reads_each_lanes_own_logits_in_a_step_with_drafts() -> None:
    """builtin:tiny on the cpu backend: greedy lanes with drafts beside a seeded sampled lane and a greedy lane
    asking for logprobs (neither gets a draft) in the same steps; every output is the one of one-token steps, so
    each lane read its own rows of the step's flat logits."""
    from atom_engine.engine import LLMEngine
    from atom_engine.settings import EngineSettings

    prompts = [[5, 6, 7] * 6, [9, 3, 9, 3, 9, 3, 1], [2, 4, 8, 16, 32], [11, 12, 11, 12, 11]]
    params = [SamplingParams(max_tokens=24, ignore_eos=True), SamplingParams(max_tokens=24, ignore_eos=True),
              SamplingParams(max_tokens=24, temperature=0.9, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=24, logprobs=2, ignore_eos=True)]

    def generate(k: int) -> tuple[list[list[int]], dict[str, int]]:
        engine = LLMEngine(EngineSettings(lanes=4, kv_blocks=6, max_seq_len=64, speculative_tokens=k))
        outs = engine.generate(prompts, params)
        return [o.token_ids for o in outs], dict(engine.batcher.counters)

    plain, _ = generate(0)
    drafted, counters = generate(5)
    assert drafted == plain
    # Rejected drafts still move the later lanes' rows: the random model rarely agrees with a guess.
    assert counters["draft_tokens"] > 0, "no step carried a draft"
