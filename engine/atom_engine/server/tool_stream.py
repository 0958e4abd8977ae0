"""The tool calls of a streamed output, sent as they are written: a call's id and name as soon as its name is
complete, then its arguments piece by piece, as OpenAI and vLLM stream them (OpenAI's clients join a call's
deltas by ``index``; partial-object parsers such as instructor's read the arguments as they grow).

Text that may begin a call (``<tool_call>``) is held back. A call written as the Hermes format writes one
(``{"name": "...", "arguments": {...}}``, which is what the tool grammar makes) streams; a call in another shape
is held until its end tag and sent whole if it parses, else sent as text, as the whole-text parse
(:func:`atom_engine.server.tools.parse_tool_calls`) decides. Once a call streams it stands: text the model
writes between its arguments and its end tag is dropped, and a call cut off (``max_tokens``) ends with the
arguments it has. Only free text (``tool_choice: auto``) can write either; under a grammar every call is whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from atom_engine.server.tools import CALL_BEGIN, CALL_END, ObjectEnd, call_header, call_id, parse_call


@dataclass
class CallDelta:
    """What one feed adds to one call: its start (``id`` and ``name``), a piece of its ``arguments``, its end
    (``done``; ``cut``: ended before its arguments did)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    done: bool = False
    cut: bool = False

    def openai(self) -> dict[str, Any] | None:
        """The chat stream's ``delta.tool_calls`` entry (None: nothing new to send)."""
        if self.id is not None:
            return {"index": self.index, "id": self.id, "type": "function",
                    "function": {"name": self.name, "arguments": self.arguments}}
        if self.arguments:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return None


@dataclass
class ToolStream:
    """``parallel`` false: calls after the first are dropped, as :func:`parse_tool_calls` drops them."""

    parallel: bool = True
    called: int = 0
    _buf: str = ""  # text not yet sent: a possible tag, or the part of a call being read
    _mode: str = "text"  # text | header (after <tool_call>) | arguments | tail (before </tool_call>) | whole
    _end: ObjectEnd = field(default_factory=ObjectEnd)
    _space: str = ""  # whitespace held: dropped between and around calls, sent before other text
    sent_text: bool = False

    def feed(self, text: str, final: bool) -> tuple[str, list[CallDelta]]:
        """The content to send now and what ``text`` adds to the calls (one :class:`CallDelta` per call)."""
        self._buf += text
        content: list[str] = []
        deltas: dict[int, CallDelta] = {}

        def delta(index: int) -> CallDelta:
            return deltas.setdefault(index, CallDelta(index))

        while True:
            if self._mode == "text":
                i = self._buf.find(CALL_BEGIN)
                if i < 0:
                    keep = 0 if final else _partial_suffix(self._buf, CALL_BEGIN)
                    content.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                content.append(self._buf[:i])
                self._buf, self._mode = self._buf[i + len(CALL_BEGIN) :], "header"
            elif self._mode == "header":
                header = call_header(self._buf)
                closed = self._buf.find(CALL_END)
                if header is not None and (closed < 0 or header[1] < closed):
                    if not self.parallel and self.called:
                        self._mode = "whole"  # dropped, or text if malformed: as the whole parse decides
                        continue
                    d = delta(self.called)
                    d.id, d.name = call_id(), header[0]
                    self.called += 1
                    self._buf, self._mode, self._end = self._buf[header[1] :], "arguments", ObjectEnd()
                elif closed >= 0:
                    self._mode = "whole"
                elif final:  # a call never closed: it stays text
                    content.append(CALL_BEGIN + self._buf)
                    self._buf, self._mode = "", "text"
                    break
                else:
                    break
            elif self._mode == "arguments":
                d = delta(self.called - 1)
                end = self._end.feed(self._buf)
                piece = self._buf if end is None else self._buf[:end]
                d.arguments += piece
                self._buf = self._buf[len(piece) :]
                if end is None:
                    if final:
                        d.done = d.cut = True
                        self._mode = "text"
                    break
                self._mode = "tail"
            elif self._mode == "tail":
                closed = self._buf.find(CALL_END)
                if closed < 0 and not final:
                    break
                delta(self.called - 1).done = True
                self._buf = self._buf[closed + len(CALL_END) :] if closed >= 0 else ""
                self._mode = "text"
            else:  # whole: a call in another shape, or one to drop, read to its end tag
                closed = self._buf.find(CALL_END)
                if closed < 0:
                    if final:
                        content.append(CALL_BEGIN + self._buf)
                        self._buf, self._mode = "", "text"
                    break
                body = self._buf[:closed]
                call = parse_call(body.strip())
                if call is None:
                    content.append(CALL_BEGIN + body + CALL_END)
                elif self.parallel or not self.called:
                    fn = call["function"]
                    deltas[self.called] = CallDelta(self.called, call["id"], fn["name"], fn["arguments"], done=True)
                    self.called += 1
                self._buf, self._mode = self._buf[closed + len(CALL_END) :], "text"
        return self._text("".join(content), final), list(deltas.values())

    def _text(self, text: str, final: bool) -> str:
        """Content as the whole-text parse gives it: whitespace next to a call is not content. Trailing
        whitespace is held until text follows (sent with it) or the end (sent only if nothing was called)."""
        body = text.rstrip()
        if not body:
            self._space += text
            if final and not self.called:
                text, self._space = self._space, ""
                return text
            return ""
        held = self._space if self.sent_text or not self.called else ""
        self._space = text[len(body):]
        if not self.sent_text and self.called:
            body = body.lstrip()
        self.sent_text = True
        return held + body


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (it may be the start of a call)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
