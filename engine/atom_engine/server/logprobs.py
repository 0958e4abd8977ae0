"""Logprobs in the two OpenAI shapes, as vLLM's server writes them.

- completions (``vllm/entrypoints/openai/completion/serving.py``, ``_create_completion_logprobs``):
  ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``; each ``top_logprobs`` entry maps token text to
  logprob for the chosen token first and then the top-N (so N or N + 1 entries); a position without an entry
  (the first prompt token under ``echo``) is ``None`` in both lists.
- chat (``chat_completion/serving.py``, ``_create_chat_logprobs``): ``{"content": [{"token", "logprob",
  "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`` with the top-N most likely tokens.

Logprobs are floored at -9999.0 as vLLM does (JSON has no -inf).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from atom_engine.sequence import TokenLogprob

FLOOR = -9999.0
TokenText = Callable[[int], str]


def token_text_fn(tokenizer: Any, as_ids: bool) -> TokenText:
    """How a token is shown: its own text, or ``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``, and
    for a model without a tokenizer)."""
    if as_ids or tokenizer is None:
        return lambda t: f"token_id:{t}"
    return lambda t: tokenizer.decode([t])


def _lp(x: float) -> float:
    return max(x, FLOOR)


def completion_logprobs(tokens: Sequence[int], entries: Sequence[TokenLogprob | None], top: int,
                        text: TokenText, offset: int = 0) -> tuple[dict[str, Any], int]:
    """The ``logprobs`` object of a completion choice (or of one streamed chunk, starting at text ``offset``),
    and the offset after it."""
    out: dict[str, Any] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for token, entry in zip(tokens, entries, strict=True):
        shown = text(token)
        out["tokens"].append(shown)
        out["text_offset"].append(offset)
        offset += len(shown)
        if entry is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(_lp(entry.logprob))
        ranked = {entry.token: entry.logprob}  # the chosen token first, then the top-N (deduplicated by id)
        for t, lp in entry.top[:top]:
            ranked.setdefault(t, lp)
        out["top_logprobs"].append({text(t): _lp(lp) for t, lp in ranked.items()})
    return out, offset


def chat_logprobs(entries: Sequence[TokenLogprob | None], text: TokenText) -> dict[str, Any]:
    def item(token: int, lp: float) -> dict[str, Any]:
        shown = text(token)
        return {"token": shown, "logprob": _lp(lp), "bytes": list(shown.encode("utf-8", errors="replace"))}

    return {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries if e is not None]}


def prompt_logprobs_vllm(entries: Sequence[TokenLogprob | None], text: TokenText) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs`` field: per prompt token ``{token_id: {logprob, rank, decoded_token}}``."""
    out: list[dict[str, Any] | None] = []
    for e in entries:
        if e is None:
            out.append(None)
            continue
        d = {str(e.token): {"logprob": _lp(e.logprob), "rank": e.rank, "decoded_token": text(e.token)}}
        for rank, (t, lp) in enumerate(e.top, start=1):
            d.setdefault(str(t), {"logprob": _lp(lp), "rank": rank, "decoded_token": text(t)})
        out.append(d)
    return out
