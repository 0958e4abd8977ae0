"""A step as plan -> execute -> apply: what the batcher's plan holds, what running it returns item by item, and
how a failed forward is rewritten into smaller ones instead of failing its neighbours."""

from __future__ import annotations

from atom_engine import limits
from atom_engine.batcher import Batcher
from atom_engine.kv_blocks import KVBlocks
from atom_engine.output_processor import OutputProcessor
from atom_engine.plan_executor import execute
from atom_engine.sequence import FinishReason, SamplingParams, Sequence, Status
from atom_engine.step_plan import StepPlan

from tests.engine.fake_runner import FakeRunner, MixingFakeRunner, echo_token, reference
from tests.engine.test_batcher import run

MAX_SEQ = 64


def make(runner_cls=FakeRunner, lanes: int = 2, chunk: int = 4, **kw) -> Batcher:  # noqa: ANN001
    kv_blocks = limits.min_kv_blocks(lanes, True) + 1
    runner = runner_cls(kv_blocks, MAX_SEQ, lanes, model=echo_token)
    return Batcher(runner, KVBlocks(kv_blocks, prefix_cache=True), lanes=lanes, max_seq_len=MAX_SEQ,
                   prefill_chunk=chunk, **kw)


def test_the_plan_names_admissions_with_copy_sources_chunks_and_the_decode_batch_with_drafts() -> None:
    b = make(speculative_tokens=3)
    first = b.add([1, 2, 3, 1, 2, 3], SamplingParams(max_tokens=4))
    run(b, [first])
    hit = b.add([1, 2, 3, 1, 2, 3, 7, 8, 9], SamplingParams(max_tokens=6))
    plan = b.schedule()
    (admission,) = plan.admissions
    assert admission.seq is hit and admission.source is not None and admission.cached == 6
    assert [(c.seq.id, c.start, len(c.tokens), c.last) for c in plan.chunks] == [(hit.id, 6, 3, True)]
    assert plan.decode is None and plan.runs_forward
    b.apply(plan, execute(b.runner, plan))
    plan = b.schedule()  # the lane prefilled last step decodes now, with a prompt-lookup draft
    assert plan.decode is not None and plan.decode.lanes[hit.lane] is hit and plan.decode.drafts[hit.lane]
    assert not plan.chunks and not plan.admissions
    b.apply(plan, execute(b.runner, plan))
    run(b, [hit])
    assert hit.output == reference(hit.prompt, 6, model=echo_token)


def test_an_idle_plan_runs_nothing() -> None:
    assert not make().schedule().runs_forward
    assert not StepPlan().runs_forward


def test_execute_returns_each_items_outcome_and_leaves_the_batcher_untouched() -> None:
    b = make(chunk=16)
    seqs = [b.add([i + 1, 5], SamplingParams(max_tokens=3)) for i in range(2)]
    plan = b.schedule()
    result = execute(b.runner, plan)
    assert all(isinstance(t, int) for t in result.chunks)  # each prompt's first token
    assert all(not s.output for s in seqs)  # applied only by apply
    outs = b.process(b.apply(plan, result))
    assert [o.new_tokens for o in outs] == [(s.output[0],) for s in seqs]


def test_a_failed_decode_forward_is_rewritten_into_one_forward_per_lane() -> None:
    b = make(chunk=16)
    good, bad = b.add([1, 2], SamplingParams(max_tokens=5)), b.add([3, 4], SamplingParams(max_tokens=5))
    b.step()  # both prefilled
    b.runner.fault = lambda s: s is bad
    plan = b.schedule()
    calls = len(b.runner.decode_calls)
    result = execute(b.runner, plan)
    # the whole batch, then each lane alone
    assert [c for c in b.runner.decode_calls[calls:]] == [[good.id, bad.id], [good.id, None], [None, bad.id]]
    assert isinstance(result.decode[bad.lane], RuntimeError) and isinstance(result.decode[good.lane], list)
    b.apply(plan, result)
    assert bad.finish_reason == FinishReason.ERROR and good.status is Status.DECODE
    b.runner.fault = lambda s: False
    run(b, [good])
    assert good.output == reference([1, 2], 5, model=echo_token)


def test_a_failed_mixed_step_is_rewritten_into_its_chunks_alone_and_the_decode_step() -> None:
    b = make(MixingFakeRunner, chunk=4)
    decoding = b.add([1, 2], SamplingParams(max_tokens=8))
    b.step()  # prefilled alone (nothing decodes yet: no mixed step)
    rider = b.add([9, 9, 9, 9, 9, 9], SamplingParams(max_tokens=3))
    b.step()  # admitted and riding
    assert b.runner.mixed_calls
    b.runner.fault = lambda s: s is rider
    plan = b.schedule()
    assert [c.seq for c in plan.riders] == [rider]
    result = execute(b.runner, plan)
    assert isinstance(result.riders[0], RuntimeError) and isinstance(result.decode[decoding.lane], list)
    b.apply(plan, result)
    assert rider.finish_reason == FinishReason.ERROR and not decoding.finished
    b.runner.fault = lambda s: False
    run(b, [decoding])
    assert decoding.output == reference([1, 2], 8, model=echo_token)


def test_the_stop_decisions_change_nothing_on_the_sequence() -> None:
    outputs = OutputProcessor(lambda ids: "".join(chr(97 + t % 26) for t in ids), eos_token_id=9)
    seq = Sequence("r", [1], SamplingParams(max_tokens=5, stop=("cd",)))
    outputs.add(seq)
    for at, token in enumerate((0, 1, 2, 3)):
        seq.output.append(token)
        ended = outputs.token_stop(seq, token)
        stop = outputs.text_stop(seq, token, at, ended)
    assert ended is None and stop is not None
    assert (stop.reason, stop.stop_reason, stop.text) == (FinishReason.STOP, "cd", "ab")
    seq.output.append(9)
    assert outputs.token_stop(seq, 9) == (FinishReason.STOP, None)  # EOS: no stop_reason
    assert (seq.finish_reason, seq.stop_reason, seq.stop_text, seq.status) == (None, None, None, Status.WAITING)


def test_a_stop_string_inside_an_accepted_draft_drops_the_rest_of_the_draft() -> None:
    detok = lambda ids: "".join(chr(97 + t % 26) for t in ids)  # noqa: E731
    full = reference([1, 2, 3, 1, 2, 3], 12, model=echo_token)
    stop = detok(full[4:6])
    b = make(speculative_tokens=5, detokenize=detok)
    s = b.add([1, 2, 3, 1, 2, 3], SamplingParams(max_tokens=12, stop=(stop,)))
    run(b, [s])
    text = detok(full)
    assert b.counters["draft_tokens_accepted"] > 0  # the echo model's drafts are kept
    assert s.stop_text == text[: text.index(stop)] and s.output == full[: len(s.output)]
    assert detok(s.output).endswith(stop) and b.counters["generation_tokens"] == len(s.output)
