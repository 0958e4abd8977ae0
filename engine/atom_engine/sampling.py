"""Turn logits into tokens: greedy, or temperature / top-k / top-p with a per-request seeded generator.

Requests that ask for nothing more take the cheap path: one batched argmax per decode step. Only a request with
penalties, ``min_tokens`` or logprobs pays for its own row: logits shaped as vLLM's sampler does (min_tokens
mask, then repetition/presence/frequency penalties, then temperature and top-k/top-p), and logprobs taken from
the raw row (vLLM's default ``raw_logprobs``), so asking for logprobs never changes the tokens.
"""

from __future__ import annotations

import torch

from atom_engine.sequence import SamplingParams, Sequence, TokenLogprob


def sample_batch(logits: torch.Tensor, batch: list[Sequence | None]) -> list[int | None]:
    """One token per lane from ``logits`` ``[lanes, vocab]`` (``None`` for an empty lane)."""
    greedy = torch.argmax(logits, dim=-1).tolist()
    return [
        None if seq is None else greedy[i] if seq.params.plain_greedy else sample(logits[i], seq)
        for i, seq in enumerate(batch)
    ]


def sample(logits: torch.Tensor, seq: Sequence) -> int:
    """One token from ``logits`` ``[vocab]`` for ``seq``; its generator lives in ``seq.sampler_state``."""
    p = seq.params
    shaped = shape_logits(logits, seq) if p.shapes_logits else logits
    if p.greedy:
        token = int(torch.argmax(shaped))
    else:
        if seq.sampler_state is None:
            gen = torch.Generator()
            gen.manual_seed(p.seed if p.seed is not None else int(torch.randint(0, 2**62, ()).item()))
            seq.sampler_state = SeededDraws(gen)
        token = int(torch.multinomial(probabilities(shaped, p), 1, generator=seq.sampler_state.at(len(seq.output))))
    if p.grammar is not None:
        seq.constraint.accept(token)
    if p.logprobs is not None:
        # One entry per output position: a decode retried after a failed batch overwrites its own entry.
        del seq.logprobs[len(seq.output):]
        seq.logprobs.append(token_logprobs(torch.log_softmax(logits.to(torch.float32), dim=-1), token, p.logprobs))
    return token


class SeededDraws:
    """A request's generator, rewound when the same output position is drawn again: a batch that failed is retried
    lane by lane, and a lane that had drawn in the failed batch must draw what it would have drawn, so a seeded
    request's output never depends on another request's failure."""

    __slots__ = ("generator", "_position", "_before")

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self._position = -1  # the output position of the last draw
        self._before: torch.Tensor | None = None  # the generator's state before it

    def at(self, position: int) -> torch.Generator:
        """The generator for a draw at ``position`` (a repeated position draws again from the same state)."""
        if position == self._position and self._before is not None:
            self.generator.set_state(self._before)
        else:
            self._position, self._before = position, self.generator.get_state()
        return self.generator


def shape_logits(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """vLLM's order: logit_bias, min_tokens hides the stop tokens, then the penalties, and a request's grammar
    masks what it forbids (a new tensor; ``logits`` is kept)."""
    p = seq.params
    x = logits.to(torch.float32).clone()
    vocab = x.numel()
    for token, bias in p.logit_bias:
        if 0 <= token < vocab:
            x[token] += bias
    if len(seq.output) < p.min_tokens:
        stops = [t for t in p.stop_token_ids if 0 <= t < vocab]
        if not p.ignore_eos and seq.eos_token_id is not None:
            stops.append(seq.eos_token_id)
        x[stops] = float("-inf")
    if p.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[torch.tensor(seq.prompt + seq.output, dtype=torch.long)] = True
        # HF's rule: positive logits are divided by the penalty, negative ones multiplied.
        x = torch.where(seen, torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty), x)
    if (p.presence_penalty or p.frequency_penalty) and seq.output:
        counts = torch.bincount(torch.tensor(seq.output, dtype=torch.long), minlength=vocab)[:vocab].to(x.dtype)
        x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(x.dtype)
    if p.grammar is not None:  # structured outputs: what the grammar forbids after the output so far
        _constraint(seq).mask(x, len(seq.output))
    return x


def _constraint(seq: Sequence):  # noqa: ANN202 (an atom_engine.structured.constraint.Constraint)
    if seq.constraint is None:
        seq.constraint = seq.params.grammar.constraint()
    return seq.constraint


def prepare_masks(batch: list[Sequence | None]) -> None:
    """Fill each grammar lane's mask for its next token (before the logits exist: a device forward runs
    meanwhile). A lane whose mask cannot be filled is left to fail in its own sampling, alone."""
    for seq in batch:
        if seq is not None and seq.params.grammar is not None:
            try:
                _constraint(seq).prepare(len(seq.output))
            except Exception:  # noqa: BLE001, S112 - sample() fills it again and fails that request only
                continue


def verify_draft(rows: torch.Tensor, draft: list[int], seq: Sequence) -> list[int]:
    """A greedy grammar lane's tokens from the logits ``[1 + len(draft), vocab]`` of its last token and draft:
    at each position the argmax of the logits the grammar masks (the matcher following the tokens taken), the
    draft token kept while it is that argmax, then the lane's own token. A draft token the grammar forbids is
    never kept (its masked logit is -inf), even where the raw argmax agrees with it."""
    c = _constraint(seq)
    out: list[int] = []
    for j in range(len(draft) + 1):
        x = rows[j].to(torch.float32).clone()
        c.mask(x, len(seq.output) + j)
        token = int(torch.argmax(x))
        c.accept(token)
        out.append(token)
        if j == len(draft) or token != draft[j] or c.terminated:  # past the grammar's end nothing follows
            break
    return out


def token_logprobs(logprobs: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """``token``'s entry from a row of log-probabilities ``[vocab]``, with the ``top`` most likely tokens."""
    lp = logprobs[token]
    rank = int((logprobs > lp).sum()) + 1
    best: tuple[tuple[int, float], ...] = ()
    if top:
        values, ids = torch.topk(logprobs, top)
        best = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token, float(lp), rank, best)


def prompt_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """Entries for ``tokens``, each scored by the row of ``logits`` ``[len(tokens), vocab]`` before it (row i:
    the model's distribution after the token preceding ``tokens[i]``)."""
    rows = torch.log_softmax(logits.to(torch.float32), dim=-1)
    return [token_logprobs(rows[i], t, top) for i, t in enumerate(tokens)]


def probabilities(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution to draw from, filtered in the usual order: temperature, then top-k, then top-p."""
    x = logits.to(torch.float32) / p.temperature
    if p.top_k and p.top_k < x.numel():
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_x, dim=-1) >= p.top_p  # keep the smallest set reaching top_p
        x = x.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return torch.softmax(x, dim=-1)
