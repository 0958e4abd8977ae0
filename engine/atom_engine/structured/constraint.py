"""One sequence's grammar state: the matcher that masks its next token and follows the tokens drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import xgrammar


class Constraint:
    """The sampler calls :meth:`mask` on the row of logits it will draw from, then :meth:`accept` with the token
    drawn. The matcher is kept in step with the sequence's output: ``mask`` is told how many output tokens the
    sequence has, and rolls back tokens accepted past that (a decode step retried after a failed batch samples
    the same position again)."""

    def __init__(self, compiled: xgrammar.CompiledGrammar, vocab_size: int) -> None:
        import xgrammar

        self._xgr = xgrammar
        self._matcher = xgrammar.GrammarMatcher(compiled)
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self.accepted = 0  # tokens the matcher has taken: the sequence's output tokens it has seen
        self._ready: int | None = None  # the output length the filled bitmask is for (see prepare)
        self._restricts = True  # the filled bitmask forbids something

    def prepare(self, done: int) -> None:
        """Fill the bitmask of the token after ``done`` output tokens now: it depends on the tokens taken only,
        so it can be filled while the device computes the logits (atom_engine.sampling.prepare_masks)."""
        self.sync(done)
        self._restricts = self._matcher.fill_next_token_bitmask(self._bitmask)
        self._ready = done

    def mask(self, logits: torch.Tensor, done: int) -> None:
        """Set the logits of the tokens the grammar forbids after ``done`` output tokens to -inf, in place
        (``logits``: ``[vocab]`` float32)."""
        if self._ready != done:
            self.prepare(done)
        self._ready = None  # used once: a retried step fills it again
        if self._restricts:
            self._xgr.apply_token_bitmask_inplace(logits[None], self._bitmask)

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise RuntimeError(f"token {token} does not follow the request's grammar")
        self.accepted += 1

    @property
    def terminated(self) -> bool:
        """The grammar took its stop token (EOS): the output ends here."""
        return self._matcher.is_terminated()

    def allows(self, token: int, done: int) -> bool:
        """Whether ``token`` may follow ``done`` output tokens (for a draft: a token the grammar forbids is never
        accepted). Leaves the matcher at ``done``."""
        self.sync(done)
        ok = self._matcher.accept_token(token)
        if ok:
            self._matcher.rollback(1)
        return ok

    def sync(self, done: int) -> None:
        if self.accepted > done:
            self._matcher.rollback(self.accepted - done)
            self.accepted = done
        elif self.accepted < done:
            raise RuntimeError(f"the grammar has seen {self.accepted} of the sequence's {done} output tokens")
