"""Incremental detokenizing: a request's output text kept up to date token by token, and the piece of it each step
may stream. Pure Python: the tokenizer's ``decode`` is passed in.

Decoding the whole output again for every token costs output length x tokens. Here each token decodes only a
small window, as vLLM's incremental detokenizer does (``prefix_offset`` / ``read_offset``): the window starts a
few tokens back (``context``), so a decoder that treats the first token specially (SentencePiece's leading space)
or a multi-byte character split over tokens decodes as it does in the whole text, and the window's text after
the context's own text is the new text. The text up to the last point where the window ended on a complete
character is *stable* (kept in pieces, never decoded again); the rest (``tail``) is decoded again until a later
token completes it. Should a window ever not begin with its context's text, the window starts over at the
first token, so the text always equals ``decode(all tokens)``.

What a stream may send follows the server's rule: never text a stop string may still cut (the last ``hold``
characters), never a trailing U+FFFD (an incomplete UTF-8 sequence waits for its next bytes), and at the end
the final text (the output or, after a stop, the text up to it).
"""

from __future__ import annotations

from collections.abc import Callable

Decode = Callable[[list[int]], str]
INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, decode: Decode, tokens: list[int], *, hold: int = 0) -> None:
        """``tokens``: the output token list, appended to by its owner before each :meth:`update`."""
        self.decode = decode
        self.tokens = tokens
        self.hold = hold
        self._pieces: list[str] = []  # the stable text
        self.stable_len = 0
        self._context = 0  # the window starts here (token index)
        self._boundary = 0  # the stable text is the decode of tokens[:_boundary]
        self._context_text = ""  # decode(tokens[_context:_boundary])
        self.tail = ""  # the text after the stable text
        self._before = (0, "")  # (stable_len, tail) before the last token: the text without it
        self._before_text: str | None = None  # that text, when a restart replaced the stable text
        self._searched = 0  # the stable length when stop strings were last searched
        self._sent_from = 0  # what was streamed: the text up to here (stable), then _sent_tail
        self._sent_tail = ""

    # -- the text ---------------------------------------------------------------------------------
    def update(self) -> None:
        """Take in the tokens appended since the last call (one per decode step)."""
        self._before, self._before_text = (self.stable_len, self.tail), None
        window = self.decode(self.tokens[self._context :])
        if not window.startswith(self._context_text):  # earlier text changed with this token
            self._restart()
            window = self.decode(self.tokens)
        self.tail = window[len(self._context_text) :]
        if window.endswith(INCOMPLETE):
            return  # the tail may still change: keep decoding it from the same window
        self._pieces.append(self.tail)
        self.stable_len += len(self.tail)
        self.tail = ""
        self._context, self._boundary = self._boundary, len(self.tokens)
        self._context_text = self.decode(self.tokens[self._context : self._boundary])

    def _restart(self) -> None:
        """Start over with the whole output as the window (a decoder whose earlier text changed with a later
        token, as byte fallback does for a run of bytes that stops being UTF-8), and compare everything, not
        only the tail, from here on: what was sent, what was searched for stop strings."""
        before = "".join(self._pieces)
        self._before_text = before[: self._before[0]] + self._before[1]
        self._sent_tail = before[: self._sent_from] + self._sent_tail
        self._sent_from = self._searched = 0
        self._pieces, self.stable_len, self.tail = [], 0, ""
        self._context = self._boundary = 0
        self._context_text = ""

    @property
    def text(self) -> str:
        """``decode(tokens)``."""
        return "".join(self._pieces) + self.tail

    @property
    def text_before_last(self) -> str:
        """The text of every token but the last (what a stop token leaves out)."""
        if self._before_text is not None:
            return self._before_text
        stable_len, tail = self._before
        return "".join(self._pieces)[:stable_len] + tail

    def since(self, start: int) -> str:
        """``text[start:]``, without joining the whole text."""
        start = max(start, 0)
        if start >= self.stable_len:
            return self.tail[start - self.stable_len :]
        parts, at = [], self.stable_len
        for piece in reversed(self._pieces):
            at -= len(piece)
            parts.append(piece[max(start - at, 0) :])
            if at <= start:
                break
        return "".join(reversed(parts)) + self.tail

    def find(self, stops: tuple[str, ...]) -> tuple[int, str] | None:
        """The first stop string in the text (the earliest; the smallest string on a tie) and where it starts.

        Only text that could hold a new match is searched: from the stable text of the last search, less the
        longest stop string (a match wholly inside text searched before was found, and ended the request)."""
        start = max(self._searched - max(len(s) for s in stops) + 1, 0)
        self._searched = self.stable_len
        recent = self.since(start)
        hits = [(start + i, s) for s in stops if (i := recent.find(s)) >= 0]
        return min(hits) if hits else None

    # -- what a stream sends ----------------------------------------------------------------------
    def stream_delta(self, final: str | None = None) -> str:
        """The text to send now; ``final``: the request ended with this text (what is left of it is sent)."""
        if final is None:
            end = self.stable_len + len(self.tail) - self.hold  # nothing a stop string may still cut
            if end < self._sent_from:
                return ""
            region = self.since(self._sent_from)[: end - self._sent_from].rstrip(INCOMPLETE)
        else:
            if len(final) < self._sent_from:
                return ""
            region = final[self._sent_from :]
        if not region.startswith(self._sent_tail):  # the text changed under what was sent: nothing now
            return ""
        delta = region[len(self._sent_tail) :]
        sent_len = self._sent_from + len(region)
        # What was sent of the stable text never changes: only the rest is compared next time.
        sent_from = min(sent_len, self.stable_len)
        self._sent_tail = region[sent_from - self._sent_from :]
        self._sent_from = sent_from
        return delta
