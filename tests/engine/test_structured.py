"""The grammar mask at sampling, below the server: every backend samples through it, a retried step keeps the
matcher in step with the output, and a token the grammar forbids is refused."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable

import jsonschema
import pytest
import torch
from atom_engine.engine import LLMEngine
from atom_engine.sampling import sample, verify_draft
from atom_engine.sequence import FinishReason, SamplingParams, Sequence
from atom_engine.settings import EngineSettings
from atom_engine.structured.compiler import Grammar, GrammarError, Grammars
from atom_engine.structured.spec import GrammarSpec

SETTINGS = dict(lanes=3, kv_blocks=6, max_seq_len=256, prefill_chunk=64, prefix_cache=True)
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "name": {"type": "string", "maxLength": 6}}, "required": ["id", "name"]}


def grammars(engine: LLMEngine) -> Grammars:
    return Grammars(engine.tokenizer, engine.vocab_size, engine.eos_token_id)


@pytest.mark.parametrize("backend", ["cpu", "atom"])
def test_every_backend_samples_through_the_mask(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "atom":
        request.getfixturevalue("rebel")
    engine = LLMEngine(EngineSettings(backend=backend, **SETTINGS))
    grammar = grammars(engine).compile(GrammarSpec.json_schema(SCHEMA))
    params = [SamplingParams(max_tokens=120, temperature=1.0, seed=s, grammar=grammar) for s in range(5)]
    outs = engine.generate(["the quick brown fox"] * 5, params)
    for o in outs:
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), SCHEMA)
    engine.kv.check_invariant()


def test_a_retried_position_rolls_the_matcher_back() -> None:
    engine = LLMEngine(EngineSettings(**SETTINGS))
    grammar = grammars(engine).compile(GrammarSpec("regex", "ab|cd"))
    seq = Sequence("r", [1, 2], SamplingParams(max_tokens=4, grammar=grammar))
    logits = torch.zeros(engine.vocab_size)
    logits[ord("c")] = 5.0  # the greedy choice among what the grammar allows
    first = sample(logits, seq)
    again = sample(logits, seq)  # the same position sampled again (a decode step retried after a failed batch)
    assert first == again == ord("c")
    seq.output.append(first)
    assert sample(logits, seq) == ord("d")  # the grammar moved on by one token, not two


def test_a_token_the_grammar_forbids_is_refused() -> None:
    engine = LLMEngine(EngineSettings(**SETTINGS))
    c = grammars(engine).compile(GrammarSpec("regex", "ab")).constraint()
    assert c.allows(ord("a"), 0) and not c.allows(ord("b"), 0)
    with pytest.raises(RuntimeError, match="does not follow the request's grammar"):
        c.accept(ord("x"))


def test_choices_escape_quotes_and_backslashes() -> None:
    engine = LLMEngine(EngineSettings(**SETTINGS))
    options = ['say "hi"', "back\\slash", "plain"]
    grammar = grammars(engine).compile(GrammarSpec.choice(options))
    outs = engine.generate(["x"] * 6, [SamplingParams(max_tokens=20, temperature=1.0, seed=s, grammar=grammar)
                                       for s in range(6)])
    assert all(o.text in options for o in outs), [o.text for o in outs]


def test_invalid_sources_raise_grammar_error_without_the_cxx_location() -> None:
    engine = LLMEngine(EngineSettings(**SETTINGS))
    g = grammars(engine)
    with pytest.raises(GrammarError) as info:
        g.compile(GrammarSpec("regex", "(a"))
    assert not re.search(r"\.cc:\d+", str(info.value)) and "parenthesis" in str(info.value)


@pytest.mark.parametrize("kind", [TypeError, KeyError, IndexError, MemoryError])
def test_any_error_xgrammar_raises_on_a_source_is_a_grammar_error(kind: type[Exception],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """tvm_ffi raises a C++ error as the Python type of its kind (tvm_ffi/error.py), not only RuntimeError."""
    import xgrammar

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise kind("[12:00:00] /project/cpp/json_schema_converter.cc:1: the schema is too deep")

    monkeypatch.setattr(xgrammar.Grammar, "from_json_schema", refuse)
    engine = LLMEngine(EngineSettings(**SETTINGS))
    with pytest.raises(GrammarError, match="^the schema is too deep$"):
        grammars(engine).compile(GrammarSpec.json_schema(SCHEMA))


def test_a_failure_of_the_engines_own_steps_is_not_a_grammar_error() -> None:
    engine = LLMEngine(EngineSettings(**SETTINGS))
    with pytest.raises(ValueError) as info:  # a spec GrammarSpec.choice never makes: an engine bug, so a 500
        grammars(engine).compile(GrammarSpec("choice", "not json"))
    assert not isinstance(info.value, GrammarError)


def _with_a_failing_matcher(failing: str, params: Callable[[Grammar, Grammar], list[SamplingParams]]
                            ) -> tuple[dict[bool, list[tuple[list[int], FinishReason | None]]], int]:
    """Each request's output and finish, served with and without the victim grammar's matcher raising at its
    fourth token (taking it, or filling its mask); and the victim's index in ``params(victim, other)``."""
    from atom_engine.structured.constraint import Constraint

    class Failing(Constraint):
        def accept(self, token: int) -> None:
            if failing == "accept" and self.accepted == 3:
                raise RuntimeError("the matcher failed")
            super().accept(token)

        def prepare(self, done: int) -> None:
            if failing == "prepare" and done == 3:
                raise RuntimeError("the matcher failed")
            super().prepare(done)

    outs, at = {}, -1
    for fail in (False, True):
        engine = LLMEngine(EngineSettings(**{**SETTINGS, "lanes": 4, "kv_blocks": 7}))
        g = grammars(engine)
        victim, other = g.compile(GrammarSpec("regex", "[a-z]{20}")), g.compile(GrammarSpec.json_schema(SCHEMA))
        if fail:
            victim.constraint = lambda v=victim: Failing(v.compiled, v.vocab_size)  # type: ignore[method-assign]
        batch = params(victim, other)
        at = next(i for i, p in enumerate(batch) if p.grammar is victim)
        seqs = [engine.add_request(p, sp) for p, sp in zip(["ab", "cd", "ef", "gh"], batch, strict=True)]
        while not all(s.finished for s in seqs):
            engine.step()
        outs[fail] = [(list(s.output), s.finish_reason) for s in seqs]
        engine.kv.check_invariant()
        if fail:
            assert seqs[at].finish_reason is FinishReason.ERROR and "the matcher failed" in (seqs[at].error or "")
            assert len(seqs[at].output) == 3
    return outs, at


@pytest.mark.parametrize("failing", ["accept", "prepare"])
def test_a_grammar_lane_whose_matcher_fails_fails_alone_and_the_other_lanes_are_exact(failing: str) -> None:
    """The matcher raising mid-decode fails that request only: the failed batch is retried lane by lane, and
    every other lane (free or with a grammar, greedy or seeded) gives what it gives when nothing fails."""
    outs, at = _with_a_failing_matcher(failing, lambda victim, other: [
        SamplingParams(max_tokens=30), SamplingParams(max_tokens=30, grammar=victim),
        SamplingParams(max_tokens=30, temperature=1.0, seed=3, grammar=other),
        SamplingParams(max_tokens=30, temperature=1.0, seed=7)])
    assert outs[True][:at] + outs[True][at + 1:] == outs[False][:at] + outs[False][at + 1:]


def test_a_seeded_lane_sampled_before_a_failing_grammar_lane_is_exact() -> None:
    outs, at = _with_a_failing_matcher("accept", lambda victim, other: [
        SamplingParams(max_tokens=30, temperature=1.0, seed=7), SamplingParams(max_tokens=30, grammar=victim),
        SamplingParams(max_tokens=30), SamplingParams(max_tokens=30)])
    assert outs[True][:at] + outs[True][at + 1:] == outs[False][:at] + outs[False][at + 1:]


def test_with_speculation_grammar_lanes_draft_and_give_what_they_give_without() -> None:
    """Greedy grammar lanes beside greedy free ones in a batch that drafts: each lane's draft is checked against
    its own argmax (under its grammar's mask for a grammar lane), so every output is what it is without
    speculation, and the grammar's outputs still match it."""
    prompts = ["abc abc abc abc abc abc abc abc", "the quick brown fox jumps over the lazy dog " * 3,
               "x y x y x y x y", "abc abc abc 12 abc abc abc 12"] * 2
    regex = r"(abc ){2,6}[0-9]{1,3}"
    outs, drafted = {}, {}
    for spec in (0, 4):
        engine = LLMEngine(EngineSettings(**{**SETTINGS, "lanes": 4, "kv_blocks": 7, "speculative_tokens": spec}))
        grammar = grammars(engine).compile(GrammarSpec("regex", regex))
        params = [SamplingParams(max_tokens=40, grammar=grammar if i % 2 == 0 else None) for i in range(len(prompts))]
        seqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        while not all(s.finished for s in seqs):
            engine.step()
        outs[spec] = [engine.output(s).text for s in seqs]
        drafted[spec] = [s.drafter is not None for s in seqs if s.params.grammar is not None]
        engine.kv.check_invariant()
    assert any(drafted[4]) and not any(drafted[0])  # grammar lanes drafted where speculation is on
    assert outs[0] == outs[4]
    assert all(re.fullmatch(regex, t) for t in outs[4][0::2])


def test_a_draft_token_the_grammar_forbids_is_never_kept() -> None:
    engine = LLMEngine(EngineSettings(**SETTINGS))
    grammar = grammars(engine).compile(GrammarSpec("regex", "ab(c|d)"))
    seq = Sequence("r", [1], SamplingParams(max_tokens=8, grammar=grammar))
    rows = torch.zeros(3, engine.vocab_size)
    rows[0, ord("b")] = 9.0  # the raw argmax agrees with the draft's first token, which the grammar forbids here
    rows[0, ord("a")] = 1.0
    assert verify_draft(rows, [ord("b"), ord("c")], seq) == [ord("a")]
    seq.output.append(ord("a"))
    rows = torch.zeros(3, engine.vocab_size)
    rows[0, ord("b")], rows[1, ord("x")], rows[1, ord("d")] = 5.0, 9.0, 1.0
    # "b" is kept; at the next position the raw argmax "x" is forbidden, the grammar's best is "d"
    assert verify_draft(rows, [ord("b"), ord("x")], seq) == [ord("b"), ord("d")]


def test_on_a_device_backend_masks_are_filled_while_the_device_runs(rebel, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:  # noqa: ANN001
    """On atom (a device of its own) each grammar lane's mask is filled on a host thread during the forward and
    only applied at sampling; the outputs are the cpu backend's, where masks are filled at sampling."""
    from atom_engine.structured.constraint import Constraint

    threads: list[str] = []
    prepare = Constraint.prepare

    def spy(self, done: int) -> None:  # noqa: ANN001
        threads.append(threading.current_thread().name)
        prepare(self, done)

    monkeypatch.setattr(Constraint, "prepare", spy)
    outs = {}
    for backend in ("cpu", "atom"):
        threads.clear()
        engine = LLMEngine(EngineSettings(backend=backend, **SETTINGS))
        grammar = grammars(engine).compile(GrammarSpec.json_schema(SCHEMA))
        params = [SamplingParams(max_tokens=80, grammar=grammar if i != 1 else None) for i in range(3)]
        outs[backend] = [o.text for o in engine.generate(["a", "b", "c"], params)]
        on_thread = sum(name.startswith("atom-grammar") for name in threads)
        if backend == "atom":
            assert on_thread > 0.8 * len(threads)  # the decode steps' masks (a prefill's first token: at sampling)
        else:
            assert on_thread == 0
    assert outs["atom"] == outs["cpu"]
    for i in (0, 2):
        jsonschema.validate(json.loads(outs["atom"][i]), SCHEMA)
