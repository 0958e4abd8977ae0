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
