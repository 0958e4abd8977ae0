"""Overlapped scheduling gives the serial engine's outputs, token for token and character for character: plain and
seeded sampling, drafts, stop strings (inside drafts too), stop tokens, logprobs, cancels, more requests than
lanes; and a request a stop string ends leaves no lane or block behind. The engine overlaps on a backend with a
device of its own (atom, on the fake RBLN SDK here), never on the cpu backend."""

from __future__ import annotations

import threading

from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings

PROMPTS = ["the quick brown fox", "abcabcabc", "hello hello hello", "x", "one two three four", "zzz zzz",
           "to be or not to be", "lorem ipsum"]


def engine(overlap: bool, **kw: object) -> LLMEngine:
    settings = dict(backend="atom", lanes=3, kv_blocks=6, max_seq_len=128, prefill_chunk=64)
    e = LLMEngine(EngineSettings(overlap_scheduling=overlap, **{**settings, **kw}))
    assert (e._overlap is not None) == overlap
    return e


def test_the_cpu_backend_steps_serially_whatever_the_setting() -> None:
    e = LLMEngine(EngineSettings(lanes=2, kv_blocks=4, max_seq_len=64, overlap_scheduling=True))
    assert e._overlap is None  # host and device are the same cores there


def params_for(full: list[str]) -> list[SamplingParams]:
    """A mix: greedy with drafts, stop strings taken from the greedy texts, seeded sampling, logprobs, a stop
    token, penalties."""
    out = []
    for i, text in enumerate(full):
        stop = next((text[j : j + 2] for j in range(3, len(text) - 2) if text[j : j + 2].strip()), "qq")
        out.append([
            SamplingParams(max_tokens=24, ignore_eos=True),
            SamplingParams(max_tokens=24, stop=(stop,), ignore_eos=True),
            SamplingParams(max_tokens=20, temperature=0.9, seed=7 + i, ignore_eos=True),
            SamplingParams(max_tokens=12, logprobs=2, ignore_eos=True),
            SamplingParams(max_tokens=24, stop=(stop,), include_stop_str_in_output=True, ignore_eos=True),
            SamplingParams(max_tokens=16, stop_token_ids=(5, 17, 101), ignore_eos=True),
            SamplingParams(max_tokens=16, repetition_penalty=1.3, ignore_eos=True),
            SamplingParams(max_tokens=8, min_tokens=4, stop=(stop[:1],), ignore_eos=True),
        ][i % 8])
    return out


def test_overlapped_outputs_equal_the_serial_ones(rebel) -> None:  # noqa: ANN001
    full = [o.text for o in engine(False).generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))]
    params = params_for(full)
    serial, overlapped = engine(False), engine(True)
    want, got = serial.generate(PROMPTS, params), overlapped.generate(PROMPTS, params)
    assert [(o.token_ids, o.text, o.finish_reason) for o in got] == [
        (o.token_ids, o.text, o.finish_reason) for o in want]
    assert any(o.finish_reason == "stop" for o in want)  # the stops were exercised
    for e in (serial, overlapped):
        while e.has_unfinished():  # the step still running after the last output
            e.step()
        e.kv.check_invariant()
        assert e.kv.counts()["lanes"] == 0 and not e.batcher.running()
    assert overlapped.batcher.counters["generation_tokens"] == serial.batcher.counters["generation_tokens"]


def test_streamed_outputs_are_the_same_tokens_text_and_logprobs(rebel) -> None:  # noqa: ANN001
    full = [o.text for o in engine(False).generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))]
    params = params_for(full)

    def stream(e: LLMEngine) -> dict[str, tuple]:
        seqs = [e.add_request(p, sp) for p, sp in zip(PROMPTS, params, strict=True)]
        got: dict[str, list] = {s.id: [[], "", [], None] for s in seqs}
        while e.has_unfinished():
            for out in e.step():
                g = got[out.request_id]
                g[0] += out.new_tokens
                g[1] += out.text
                g[2] += [lp.token for lp in out.logprobs]
                if out.finished:
                    g[3] = (out.finish_reason, out.stop_reason, out.final_text)
        return {i: tuple(map(str, g)) for i, g in enumerate(got.values())}

    assert stream(engine(True)) == stream(engine(False))


def test_a_cancel_while_a_step_runs_ends_the_request_and_frees_its_lane(rebel) -> None:  # noqa: ANN001
    e = engine(True, lanes=2, kv_blocks=4)
    keep = e.add_request("keep going", SamplingParams(max_tokens=30, ignore_eos=True))
    doomed = e.add_request("cancel me", SamplingParams(max_tokens=100, ignore_eos=True))
    e.step()
    e.step()
    cancelled = threading.Event()

    def cancel() -> None:
        e.cancel(doomed.id)
        cancelled.set()

    threading.Thread(target=cancel).start()
    cancelled.wait(5)
    while e.has_unfinished():
        e.step()
    assert doomed.finish_reason == "cancelled" and keep.finish_reason == "length" and len(keep.output) == 30
    e.kv.check_invariant()
    assert e.kv.counts()["lanes"] == 0


def test_a_stop_string_inside_an_accepted_draft_is_cut_the_same_way_overlapped() -> None:
    from atom_engine.overlap import OverlappedSteps

    from tests.engine.fake_runner import echo_token, reference
    from tests.engine.test_step_plan import make

    detok = lambda ids: "".join(chr(97 + t % 26) for t in ids)  # noqa: E731
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5, 6, 4], [7, 8, 9, 7, 8], [2, 4, 6, 2, 4, 6]]

    def run(overlap: bool) -> tuple[list, dict]:
        b = make(lanes=2, speculative_tokens=5, detokenize=detok)
        steps = OverlappedSteps(b, b.runner) if overlap else b
        seqs = []
        for p in prompts:
            full = reference(p, 14, model=echo_token)
            seqs.append(b.add(p, SamplingParams(max_tokens=14, stop=(detok(full[5:7]),))))
        for _ in range(200):
            steps.step()
            if all(s.output_done for s in seqs) and not (overlap and steps.holding):
                break
        b.kv.check_invariant()
        assert b.kv.counts()["lanes"] == 0
        return [(s.output, s.stop_text, s.finish_reason) for s in seqs], b.counters

    (serial, counters), (overlapped, counters_overlapped) = run(False), run(True)
    assert overlapped == serial and counters["draft_tokens_accepted"] > 0
    assert all(reason == "stop" for _, _, reason in serial)
    assert counters_overlapped["generation_tokens"] == counters["generation_tokens"]


# -- planning step N+1 while step N runs (plain decode steps) --------------------------------------------------

DETOK = lambda ids: "".join(chr(97 + t % 26) for t in ids)  # noqa: E731


def _batcher(lanes: int = 2):  # noqa: ANN202
    """A batcher on the fake model (a hash of the block's contents: a stale token or position changes it)."""
    from atom_engine import limits
    from atom_engine.batcher import Batcher
    from atom_engine.kv_blocks import KVBlocks

    from tests.engine.fake_runner import FakeRunner

    kv_blocks = limits.min_kv_blocks(lanes, True) + 1
    return Batcher(FakeRunner(kv_blocks, 64, lanes), KVBlocks(kv_blocks, prefix_cache=True), lanes=lanes,
                   max_seq_len=64, prefill_chunk=4, detokenize=DETOK)


def _drive(b, steps, seqs, outs: dict | None = None) -> int:  # noqa: ANN001
    """Step until every request's final output is made and nothing is held; returns the steps taken."""
    for n in range(1, 500):
        for o in steps.step():
            if outs is not None:
                outs.setdefault(o.request_id, []).append(o)
        b.kv.check_invariant()
        if all(s.output_done for s in seqs) and not b.has_work() and not getattr(steps, "holding", False):
            return n
    raise AssertionError("requests did not finish")


def _stopping_params(prompts: list[list[int]]) -> list[SamplingParams]:
    """Stop tokens, stop strings and lengths, each met early by some request (the fake model is greedy)."""
    from tests.engine.fake_runner import reference

    out = []
    for i, p in enumerate(prompts):
        full = reference(p, 12)
        out.append([
            SamplingParams(max_tokens=12),
            SamplingParams(max_tokens=12, stop_token_ids=(full[4],)),
            SamplingParams(max_tokens=12, stop=(DETOK(full[5:7]),)),
            SamplingParams(max_tokens=3 + i % 4),
            SamplingParams(max_tokens=12, stop=(DETOK(full[2:3]),), include_stop_str_in_output=True),
        ][i % 5])
    return out


def test_planned_ahead_steps_give_the_serial_outputs_and_leave_nothing_behind() -> None:
    from atom_engine.overlap import OverlappedSteps

    prompts = [[1, 2, 3], [4] * 9, [1, 2, 3, 4, 5], [9], [4] * 9 + [1], [7, 7], [3, 1], [2, 2, 2, 5], [8], [6, 1]]
    params = _stopping_params(prompts)

    def run(overlap: bool) -> tuple[list, dict, dict, int]:
        b = _batcher(lanes=3)
        steps = OverlappedSteps(b, b.runner) if overlap else b
        ahead = 0
        if overlap:  # count the steps planned while another ran
            schedule = b.schedule

            def counted(**kw: object):  # noqa: ANN202
                nonlocal ahead
                ahead += kw.get("running") is not None
                return schedule(**kw)

            b.schedule = counted  # type: ignore[method-assign]
        seqs = [b.add(p, sp) for p, sp in zip(prompts, params, strict=True)]
        outs: dict = {}
        _drive(b, steps, seqs, outs)
        if overlap:
            steps.close()
        assert b.kv.counts()["lanes"] == 0 and not b.running()
        streamed = {s.id: ([t for o in outs[s.id] for t in o.new_tokens], "".join(o.text for o in outs[s.id]),
                           sum(o.finished for o in outs[s.id])) for s in seqs}
        return ([(s.output, s.finish_reason, s.stop_reason, s.text) for s in seqs], streamed,
                dict(b.counters), ahead)

    serial, serial_streamed, serial_counters, _ = run(False)
    got, streamed, counters, ahead = run(True)
    assert got == serial and streamed == serial_streamed
    assert all(finals == 1 for _, _, finals in streamed.values())  # one final output each, nothing after it
    assert {reason for _, reason, _, _ in serial} == {"stop", "length"}
    assert counters["generation_tokens"] == serial_counters["generation_tokens"]
    assert counters["requests_finished"] == serial_counters["requests_finished"] == len(prompts)
    assert ahead > 10  # most steps were planned while the previous one ran


def test_a_lane_that_stops_at_step_n_rides_step_n_plus_1_but_emits_nothing_from_it_and_frees_its_block() -> None:
    from atom_engine.overlap import OverlappedSteps

    from tests.engine.fake_runner import reference

    b = _batcher(lanes=2)
    steps = OverlappedSteps(b, b.runner)
    long = b.add([4, 5, 6], SamplingParams(max_tokens=20))
    stop_at = reference([1, 2, 3], 20)[3]
    short = b.add([1, 2, 3], SamplingParams(max_tokens=20, stop_token_ids=(stop_at,)))
    outs: dict = {}
    lanes_before_release = None
    for _ in range(100):
        for o in steps.step():
            outs.setdefault(o.request_id, []).append(o)
        b.kv.check_invariant()
        if short.finished and lanes_before_release is None:
            lanes_before_release = b.kv.counts()["lanes"]  # its block waits for the step it rides
        if short.output_done and b.kv.counts()["lanes"] == 1:
            break
    want = reference([1, 2, 3], 20)[: reference([1, 2, 3], 20).index(stop_at) + 1]
    assert short.output == want and short.finish_reason == "stop"
    assert [t for o in outs[short.id] for t in o.new_tokens] == want  # the ridden step's token is not emitted
    assert outs[short.id][-1].finished and sum(o.finished for o in outs[short.id]) == 1
    # it was in the decode step after the one that gave its stop token (planned before that token was seen)
    rides = sum(short.id in call for call in b.runner.decode_calls)
    assert rides == len(want)  # one step per token after the first (prefill's), plus the step it rode
    assert lanes_before_release == 2 and b.kv.counts()["lanes"] == 1 and b.lanes.count(None) == 1
    assert short.computed == len(short.prompt) + len(want) - 1  # the ridden step's KV is not counted
    _drive(b, steps, [long])
    steps.close()
    assert long.output == reference([4, 5, 6], 20)
    assert b.kv.counts()["lanes"] == 0


def test_a_cancel_while_the_next_step_is_planned_ahead_ends_the_request_and_frees_its_lane() -> None:
    from atom_engine.overlap import OverlappedSteps

    from tests.engine.fake_runner import reference

    b = _batcher(lanes=2)
    steps = OverlappedSteps(b, b.runner)
    keep = b.add([1, 2, 3], SamplingParams(max_tokens=16))
    doomed = b.add([4, 5, 6], SamplingParams(max_tokens=40))
    later = b.add([7, 8], SamplingParams(max_tokens=5))  # waits for a lane: gets the cancelled one
    outs: dict = {}
    for _ in range(5):
        for o in steps.step():
            outs.setdefault(o.request_id, []).append(o)
    assert steps._next is not None  # the next step was planned while the last one ran
    b.cancel(doomed.id)
    _drive(b, steps, [keep, doomed, later], outs)
    steps.close()
    assert doomed.finish_reason == "cancelled"
    emitted = [t for o in outs[doomed.id] for t in o.new_tokens]
    assert emitted == doomed.output == reference([4, 5, 6], 40)[: len(doomed.output)]
    assert sum(o.finished for o in outs[doomed.id]) == 1 and outs[doomed.id][-1].finished
    assert keep.output == reference([1, 2, 3], 16) and later.output == reference([7, 8], 5)
    assert b.kv.counts()["lanes"] == 0 and not b.running()
    assert b.counters["requests_cancelled"] == 1


def test_a_failure_in_a_step_whose_next_step_is_planned_ends_that_request_only() -> None:
    from atom_engine.overlap import OverlappedSteps

    from tests.engine.fake_runner import reference

    b = _batcher(lanes=3)
    steps = OverlappedSteps(b, b.runner)
    seqs = [b.add(p, SamplingParams(max_tokens=12)) for p in ([1, 2, 3], [4, 5, 6], [7, 8], [2, 5])]
    bad = seqs[1]
    b.runner.fault = lambda seq: seq is bad and len(seq.output) >= 4  # its 5th token's forward fails
    outs: dict = {}
    _drive(b, steps, seqs, outs)
    steps.close()
    assert bad.finish_reason == "error" and "injected fault" in (bad.error or "")
    assert bad.output == reference([4, 5, 6], 12)[:4]
    assert [t for o in outs[bad.id] for t in o.new_tokens] == bad.output
    assert outs[bad.id][-1].finished and outs[bad.id][-1].finish_reason == "error"
    for s in (seqs[0], seqs[2], seqs[3]):
        assert s.finish_reason == "length" and s.output == reference(s.prompt, 12)
    assert b.kv.counts()["lanes"] == 0 and not b.running()
    assert b.counters["requests_failed"] == 1


def test_a_step_with_admissions_or_prefill_is_not_planned_ahead_of() -> None:
    from atom_engine.overlap import OverlappedSteps

    b = _batcher(lanes=2)
    steps = OverlappedSteps(b, b.runner)
    first = b.add([1, 2, 3], SamplingParams(max_tokens=8))
    steps.step()  # admission and prefill: the next step is planned after it is applied
    assert steps._next is None and first.output and first.status.name == "DECODE"
    steps.step()  # a plain decode step: the next one is planned while it runs
    assert steps._next is not None and steps._taken is not None
    steps.close()
