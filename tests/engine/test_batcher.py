"""The lane batcher against a fake runner: continuous batching, chunked prefill, stops, cancel, isolation."""

from __future__ import annotations

import pytest
from atom_engine import limits
from atom_engine.batcher import Batcher
from atom_engine.errors import QueueFull, RequestRejected
from atom_engine.kv_blocks import KVBlocks
from atom_engine.sequence import SamplingParams, Sequence, Status

from tests.engine.fake_runner import FakeRunner, reference

MAX_SEQ = 64


def make(lanes: int = 2, prefix_cache: bool = True, chunk: int = 4, extra_blocks: int = 0, **kw) -> Batcher:
    kv_blocks = limits.min_kv_blocks(lanes, prefix_cache) + extra_blocks
    runner = FakeRunner(kv_blocks, MAX_SEQ, lanes)
    return Batcher(runner, KVBlocks(kv_blocks, prefix_cache=prefix_cache), lanes=lanes, max_seq_len=MAX_SEQ,
                   prefill_chunk=chunk, **kw)


def run(b: Batcher, seqs: list[Sequence], max_steps: int = 500) -> None:
    for _ in range(max_steps):
        if all(s.finished for s in seqs):
            return
        b.step()
        b.kv.check_invariant()
    raise AssertionError("requests did not finish")


def test_outputs_match_the_reference_with_more_requests_than_lanes() -> None:
    b = make(lanes=2)
    prompts = [[1, 2, 3], [4] * 9, [1, 2, 3, 4, 5], [9], [4] * 9 + [1], [7, 7]]
    seqs = [b.add(p, SamplingParams(max_tokens=3 + i)) for i, p in enumerate(prompts)]
    run(b, seqs)
    for i, (s, p) in enumerate(zip(seqs, prompts, strict=True)):
        assert s.output == reference(p, 3 + i) and s.finish_reason == "length"
    assert b.kv.counts()["lanes"] == 0


def test_a_finished_lane_is_refilled_at_the_next_step() -> None:
    b = make(lanes=2, chunk=8)
    short = b.add([1], SamplingParams(max_tokens=1))
    long = b.add([2], SamplingParams(max_tokens=10))
    waiting = b.add([3], SamplingParams(max_tokens=2))
    b.step()  # both prefilled; short is done after its first token
    assert short.finished and waiting.status is Status.WAITING
    b.step()
    assert waiting.lane == short.lane and waiting.status is not Status.WAITING and not long.finished


def test_prefill_runs_in_chunks_of_prefill_chunk_tokens() -> None:
    b = make(lanes=1, chunk=4)
    s = b.add(list(range(10)), SamplingParams(max_tokens=2))
    run(b, [s])
    assert b.runner.prefill_calls == [(s.id, 0, 4), (s.id, 4, 4), (s.id, 8, 2)]
    assert s.output == reference(list(range(10)), 2)


def test_decode_batches_all_decoding_lanes_in_one_static_call() -> None:
    b = make(lanes=3, chunk=16)
    seqs = [b.add([i + 1], SamplingParams(max_tokens=4)) for i in range(2)]
    run(b, seqs)
    assert all(len(call) == 3 and call[2] is None for call in b.runner.decode_calls)
    assert b.runner.decode_calls[0][:2] == [seqs[0].id, seqs[1].id]


def test_prefix_hit_copies_and_prefills_only_the_rest() -> None:
    b = make(lanes=1)
    first = b.add([5, 6, 7, 8, 9], SamplingParams(max_tokens=3))
    run(b, [first])
    second = b.add([5, 6, 7, 8, 9, 1, 2], SamplingParams(max_tokens=3))
    run(b, [second])
    assert second.cached_tokens == 5 and len(b.runner.copies) == 1
    assert [c for c in b.runner.prefill_calls if c[0] == second.id] == [(second.id, 5, 2)]
    assert second.output == reference([5, 6, 7, 8, 9, 1, 2], 3)


def test_cache_entry_key_covers_only_tokens_with_kv() -> None:
    b = make(lanes=1)
    s = b.add([1, 2, 3], SamplingParams(max_tokens=3))
    run(b, [s])
    # the last sampled token was never fed back, so its KV is not in the block
    assert list(b.kv.cache) == [tuple(s.tokens[:-1])]


def test_eos_stops_and_ignore_eos_does_not() -> None:
    prompt = [3, 1]
    full = reference(prompt, 20)
    eos = full[2]
    b = make(lanes=2, eos_token_id=eos)
    stopped = b.add(prompt, SamplingParams(max_tokens=20))
    ignored = b.add(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    run(b, [stopped, ignored])
    assert stopped.output == full[: full.index(eos) + 1] and stopped.finish_reason == "stop"
    assert ignored.output == full and ignored.finish_reason == "length"


def test_stop_token_ids_stop() -> None:
    full = reference([8], 10)
    b = make(lanes=1)
    s = b.add([8], SamplingParams(max_tokens=10, stop_token_ids=(full[3],)))
    run(b, [s])
    assert s.output == full[: full.index(full[3]) + 1] and s.finish_reason == "stop"


def test_stop_strings_stop_and_cut_the_text() -> None:
    full = reference([2, 2], 12)
    detok = lambda ids: "".join(chr(ord("a") + t % 26) for t in ids)  # noqa: E731
    stop = detok(full[4:6])
    b = make(lanes=1, detokenize=detok)
    s = b.add([2, 2], SamplingParams(max_tokens=12, stop=(stop,)))
    run(b, [s])
    text = detok(full)
    assert s.finish_reason == "stop" and s.stop_text == text[: text.index(stop)]
    assert len(s.output) <= 6


def test_request_that_cannot_fit_is_refused_up_front() -> None:
    b = make(lanes=1)
    with pytest.raises(RequestRejected) as err:
        b.add([1] * 60, SamplingParams(max_tokens=5))
    assert str(err.value).startswith(
        "maximum context length is 64 tokens; the prompt has 60 tokens and max_tokens is 5"
    )
    assert not b.waiting and b.kv.counts()["lanes"] == 0
    b.add([1] * 59, SamplingParams(max_tokens=5))  # exactly fits


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(RequestRejected, match="empty"):
        make().add([], SamplingParams())


def test_queue_bound_gives_queue_full() -> None:
    b = make(lanes=1, max_waiting=2)
    b.add([1], SamplingParams())
    b.add([1], SamplingParams())
    with pytest.raises(QueueFull, match="maxWaiting=2"):
        b.add([1], SamplingParams())


def test_cancel_while_waiting_and_mid_decode_leaves_others_exact() -> None:
    b = make(lanes=2)
    keep = b.add([1, 2], SamplingParams(max_tokens=12))
    mid = b.add([3, 4], SamplingParams(max_tokens=12))
    queued = b.add([5], SamplingParams(max_tokens=3))
    for _ in range(4):
        b.step()
    b.cancel(mid.id)
    b.cancel(queued.id)
    run(b, [keep, mid, queued])
    assert mid.finish_reason == "cancelled" and 0 < len(mid.output) < 12
    assert queued.finish_reason == "cancelled" and queued.output == []
    assert keep.output == reference([1, 2], 12)


def test_fault_in_prefill_fails_only_that_request() -> None:
    b = make(lanes=2)
    b.runner.fault = lambda s: s.prompt[0] == 99
    bad = b.add([99, 1, 2], SamplingParams(max_tokens=4))
    good = [b.add([i, i], SamplingParams(max_tokens=4)) for i in range(1, 4)]
    run(b, [bad, *good])
    assert bad.finish_reason == "error" and "injected fault" in bad.error
    for s in good:
        assert s.output == reference(s.prompt, 4)


def test_fault_in_decode_is_isolated_to_its_lane() -> None:
    b = make(lanes=3)
    bad = b.add([1, 1], SamplingParams(max_tokens=8))
    good = [b.add([i], SamplingParams(max_tokens=8)) for i in (2, 3, 4)]
    b.step()
    b.runner.fault = lambda s: s is bad  # from now on: mid-decode
    run(b, [bad, *good])
    assert bad.finish_reason == "error" and 0 < len(bad.output) < 8
    for s in good:
        assert s.output == reference(s.prompt, 8), s.id
    assert b.kv.counts() == {"free": b.kv.kv_blocks - 1 - len(b.kv.cache), "lanes": 0,
                             "cached": len(b.kv.cache), "scratch": 1}


def test_failed_block_is_not_cached() -> None:
    b = make(lanes=1)
    b.runner.fault = lambda s: True
    s = b.add([4, 4, 4], SamplingParams(max_tokens=3))
    run(b, [s])
    assert s.finish_reason == "error" and not b.kv.cache
    b.runner.fault = lambda s: False
    again = b.add([4, 4, 4], SamplingParams(max_tokens=3))
    run(b, [again])
    assert again.cached_tokens == 0 and again.output == reference([4, 4, 4], 3)


def test_lanes_one_kv_blocks_two_without_cache_serves_the_same_prompt_twice() -> None:
    b = make(lanes=1, prefix_cache=False)
    assert b.kv.kv_blocks == 2
    a = b.add([6, 5, 4], SamplingParams(max_tokens=5))
    c = b.add([6, 5, 4], SamplingParams(max_tokens=5))
    run(b, [a, c])
    assert a.output == c.output == reference([6, 5, 4], 5)


def test_decode_seconds_run_from_the_first_token_to_the_end_of_each_request() -> None:
    """What an autoscaler turns arrivals into lanes with (seconds of lane per max_token asked): a step is one tick
    of the clock here, a request decodes from the step that completes its prompt, and a cancel counts too (it held
    its lane until then); one still queued at its cancel never decoded and adds nothing."""
    ticks = iter(range(1000))
    b = make(lanes=2, chunk=8, clock=lambda: float(next(ticks)))
    one = b.add([1, 2], SamplingParams(max_tokens=3))
    two = b.add([3], SamplingParams(max_tokens=20))
    queued = b.add([4], SamplingParams(max_tokens=5))
    run(b, [one])
    assert b.counters.decoded_max_tokens == 3 and b.counters.arrived_max_tokens == 3 + 20 + 5
    first = b.counters.decode_seconds
    assert first > 0
    b.cancel(two.id)
    b.cancel(queued.id)
    run(b, [two, queued])
    assert two.finish_reason == "cancelled" and queued.finish_reason == "cancelled"
    assert b.counters.decoded_max_tokens == 3 + 20 and b.counters.decode_seconds > first
    assert b.counters.requests_cancelled == 2
