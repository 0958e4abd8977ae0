"""Prompt-lookup drafts (n-gram speculation): guess a greedy request's next tokens from its own text.

A small model decoding greedily repeats itself, and often repeats its prompt: the tokens that followed the last
occurrence of the sequence's newest n-gram are a good guess at what follows now (a copy that reaches the text's
end goes on copying itself: the text repeats with that period). The decode step then feeds each lane its last
token plus a draft of up to ``k`` guessed tokens (how many follows how the request's drafts fare), and keeps the
guesses the model itself would have produced (the argmax at each position, checked in order) plus the model's own
next token, so the output is the one plain greedy decoding gives, in fewer steps. A step over 8 lanes reads
every weight once whatever its row count, so the extra rows are cheap next to the steps saved
(benchmarks/results/measured-in-place.md).
vLLM's ``ngram`` speculative method matches the same way (``vllm/v1/spec_decode/ngram_proposer.py``).

Pure Python: the index grows by a few dict writes per output token, and a lookup is a few dict reads.
"""

from __future__ import annotations

# The longest and shortest n-gram matched, longest first (a longer match is a better guess).
NGRAM_MAX = 3
NGRAM_MIN = 1
# A draft's length follows how the request's drafts fare, as Hugging Face's assisted generation schedules its
# draft length ("heuristic": +2 after a draft kept whole, -1 otherwise, never below 1;
# transformers/generation/candidate_generator.py). It starts at REACH_START; the setting caps it.
REACH_START = 2
REACH_GROW = 2


class PromptLookup:
    """An index of one sequence's n-grams (n = NGRAM_MIN..NGRAM_MAX): for each, where the tokens after its latest
    occurrence start. It reads the sequence's prompt and output lists in place and indexes what was appended since
    the last call, so the batcher never copies a sequence to draft for it."""

    def __init__(self) -> None:
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest occurrence
        self._indexed = 0  # tokens of prompt + output indexed so far

    def propose(self, prompt: list[int], output: list[int], k: int) -> list[int]:
        """``k`` guessed tokens to follow ``prompt + output`` (none when no n-gram recurs)."""
        if k <= 0:
            return []
        self._index(prompt, output)
        n_total = len(prompt) + len(output)
        for n in range(min(NGRAM_MAX, n_total - 1), NGRAM_MIN - 1, -1):
            start = self._next.get(_tail(prompt, output, n_total - n, n_total))
            if start is not None:
                return _continue(list(_tail(prompt, output, start, min(start + k, n_total))), k)
        return []

    def _index(self, prompt: list[int], output: list[int]) -> None:
        # Token j becomes known: every n-gram ending just before it (at j-1) now has a continuation starting at j.
        # The newest n-grams (ending at the last token) have none yet, so a lookup never matches itself.
        n_total = len(prompt) + len(output)
        for j in range(max(self._indexed, 1), n_total):
            for n in range(NGRAM_MIN, min(NGRAM_MAX, j) + 1):
                self._next[_tail(prompt, output, j - n, j)] = j
        self._indexed = n_total


class Drafter:
    """One greedy request's drafts: its n-gram index, and how far to guess. A request that repeats itself drafts
    up to the cap; one whose drafts miss drafts one token, so it stops paying for rows the step throws away. Capped
    at 5, it takes about the lane-steps of a fixed 4 with about the rejected rows of a fixed 3
    (benchmarks/results/measured-in-place.md)."""

    def __init__(self) -> None:
        self.lookup = PromptLookup()
        self.reach = REACH_START

    def draft(self, prompt: list[int], output: list[int], cap: int) -> list[int]:
        return self.lookup.propose(prompt, output, min(cap, self.reach))

    def kept(self, drafted: int, accepted: int) -> None:
        """How the last draft fared: the model agreed with ``accepted`` of its ``drafted`` tokens. The next reach
        grows from what was drafted (the cap may have cut the reach), so it never runs far past the cap."""
        if drafted:
            self.reach = drafted + REACH_GROW if accepted == drafted else max(1, drafted - 1)


def _continue(copied: list[int], k: int) -> list[int]:
    """Extend a draft copied from the text's end as the copy itself goes on: a match ``p`` tokens back copies
    only ``p`` tokens before it reaches the end, and the text's next ``p`` tokens, if it keeps repeating, are the
    ones just copied. So ``x y x y`` (match of ``x y`` 2 back) drafts ``x y x y ...``, not just ``x y``. On the
    benchmark's SmolLM2 outputs this cuts a lane's steps at 4 drafted tokens markedly at about as many rejected rows
    (benchmarks/results/measured-in-place.md)."""
    period = len(copied)  # the copy reached the end after this many tokens (else it already has k)
    while 0 < len(copied) < k:
        copied.append(copied[len(copied) - period])
    return copied


def _tail(prompt: list[int], output: list[int], lo: int, hi: int) -> tuple[int, ...]:
    """Tokens ``lo..hi-1`` of ``prompt + output`` without building the concatenation."""
    p = len(prompt)
    if hi <= p:
        return tuple(prompt[lo:hi])
    if lo >= p:
        return tuple(output[lo - p : hi - p])
    return tuple(prompt[lo:]) + tuple(output[: hi - p])
