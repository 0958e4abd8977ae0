"""The incremental detokenizer against decoding the whole output again for every token (the rule it replaces):
the same text after every token, the same streamed pieces (hold for stop strings, incomplete UTF-8 held back,
the final text), and the same first stop string, for byte-level, SentencePiece-style and word-level decoders."""

from __future__ import annotations

import random

import pytest
from atom_engine.detokenizer import IncrementalDetokenizer
from atom_engine.model.builtin import checkpoint_path
from atom_engine.model.tokenizer import ByteTokenizer, HFTokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models


class WholeDecode:
    """The rule before: decode every token so far at each step (the server's streaming and the batcher's stop
    strings did this)."""

    def __init__(self, decode, hold: int) -> None:  # noqa: ANN001
        self.decode, self.hold, self.tokens, self.sent = decode, hold, [], ""

    def delta(self, final: str | None = None) -> str:
        if final is not None:
            full = final
        else:
            full = self.decode(self.tokens)
            # max(.., 0): the rule as meant; the server's old slice full[: len(full) - hold] counted from the end
            # when the text was shorter than the hold, sending text a stop string could still cut.
            full = full[: max(len(full) - self.hold, 0)]
            if full.endswith("\ufffd"):
                full = full.rstrip("\ufffd")
        if not full.startswith(self.sent):
            return ""
        out, self.sent = full[len(self.sent):], full
        return out

    def find(self, stops: tuple[str, ...]) -> tuple[int, str] | None:
        text = self.decode(self.tokens)
        hits = [(i, s) for s in stops if (i := text.find(s)) >= 0]
        return min(hits) if hits else None


def check_stream(decode, tokens: list[int], stops: tuple[str, ...], search_from: int, stop_at: int | None) -> None:  # noqa: ANN001
    hold = max((len(s) for s in stops), default=1) - 1
    ref = WholeDecode(decode, hold)
    output: list[int] = []
    det = IncrementalDetokenizer(decode, output, hold=hold)
    for n, token in enumerate(tokens, start=1):
        output.append(token)
        ref.tokens.append(token)
        det.update()
        assert det.text == decode(output)
        assert det.text_before_last == decode(output[:-1])
        hit = det.find(stops) if stops and n > search_from else None
        assert hit == (ref.find(stops) if stops and n > search_from else None)
        if hit is not None:  # a stop string ends the request (as in the batcher): the text up to it is final
            assert det.stream_delta(det.text[: hit[0]]) == ref.delta(det.text[: hit[0]])
            return
        if n == stop_at or n == len(tokens):
            final = det.text_before_last if n == stop_at else det.text
            assert det.stream_delta(final) == ref.delta(final)
            return
        assert det.stream_delta() == ref.delta()


def byte_streams() -> st.SearchStrategy:
    """Bytes that are mostly UTF-8 text (multi-byte characters split over tokens) with stray invalid bytes."""
    chars = st.sampled_from(["a", "b", " ", "é", "€", "你", "😀", "\ufffd"]).map(lambda c: list(c.encode()))
    junk = st.lists(st.sampled_from([0x80, 0xBF, 0xE2, 0xF0, 0xFF, 257, 300]), min_size=1, max_size=2)
    return st.lists(st.one_of(chars, chars, chars, junk), max_size=30).map(lambda parts: sum(parts, []))


@settings(max_examples=300, deadline=None)
@given(tokens=byte_streams(), stops=st.lists(st.sampled_from(["a", "ab", "é€", "\ufffd", "b b", "😀a"]),
                                             max_size=3).map(tuple),
       search_from=st.integers(0, 5), stop_at=st.one_of(st.none(), st.integers(1, 40)))
def test_byte_tokenizer_matches_whole_decoding(tokens: list[int], stops: tuple[str, ...], search_from: int,
                                               stop_at: int | None) -> None:
    if tokens:
        check_stream(ByteTokenizer().decode, tokens, stops, search_from, stop_at)


def sentencepiece_style() -> Tokenizer:
    """A Llama-2-style decoder: ``▁`` is a space, byte-fallback pieces, and the leading space stripped."""
    pieces = ["<unk>", "<s>", "▁", "▁a", "b", "▁héllo", "lo", "<0xE2>", "<0x82>", "<0xAC>", "<0xF0>", "▁▁x"]
    tok = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


def word_level() -> Tokenizer:
    """No decoder at all: tokens are joined with spaces."""
    return Tokenizer(models.WordLevel({f"w{i}": i for i in range(20)}, unk_token="w0"))


@pytest.mark.parametrize("make", [sentencepiece_style, word_level])
def test_hf_decoders_match_whole_decoding(make) -> None:  # noqa: ANN001
    tok = make()
    vocab = tok.get_vocab_size()
    rng = random.Random(7)
    for _ in range(200):
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 25))]
        stops = tuple(rng.sample([" a", "b", "é", "lo b", "w1"], rng.randint(0, 2)))
        check_stream(lambda ids: tok.decode(ids, skip_special_tokens=True), tokens, stops, rng.randint(0, 3),
                     rng.choice([None, rng.randint(1, 25)]))


def test_trained_model_tokenizer_matches_whole_decoding() -> None:
    path = checkpoint_path("builtin:smollm2-135m")  # ValueError naming `make model` when it was not converted
    tok = HFTokenizer(path / "tokenizer.json", eos_token_id=2)
    rng = random.Random(3)
    text = "Écris «ça va?» 你好 😀 naïve café — done.\n\tTabs and  spaces; code: x += 1 # ok"
    base = tok.encode(text)
    for _ in range(100):
        # Real text cut at random points, random ids (byte-level pieces of multi-byte characters) mixed in.
        tokens = base[rng.randrange(len(base)):] + [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.3:
            rng.shuffle(tokens)
        stops = tuple(rng.sample(["ça", " 你", "\n", "x +", "é"], rng.randint(0, 2)))
        check_stream(tok.decode, tokens, stops, rng.randint(0, 3), rng.choice([None, rng.randint(1, 30)]))


def test_each_token_decodes_a_window_not_the_whole_output() -> None:
    decoded: list[int] = []

    def decode(ids: list[int]) -> str:
        decoded.append(len(ids))
        return ByteTokenizer().decode(ids)

    output: list[int] = []
    det = IncrementalDetokenizer(decode, output)
    for t in b"hello world, a long answer" * 20:
        output.append(t)
        det.update()
    assert det.text == "hello world, a long answer" * 20
    assert max(decoded) <= 2  # ASCII: the window is the previous token and the new one
