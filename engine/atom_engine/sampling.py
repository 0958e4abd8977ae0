"""Turn logits into tokens: greedy, or temperature / top-k / top-p with a per-request seeded generator."""

from __future__ import annotations

import torch

from atom_engine.sequence import SamplingParams, Sequence


def sample(logits: torch.Tensor, seq: Sequence) -> int:
    """One token from ``logits`` ``[vocab]`` for ``seq``; its generator lives in ``seq.sampler_state``."""
    p = seq.params
    if p.greedy:
        return int(torch.argmax(logits))
    if seq.sampler_state is None:
        gen = torch.Generator()
        gen.manual_seed(p.seed if p.seed is not None else int(torch.randint(0, 2**62, ()).item()))
        seq.sampler_state = gen
    return int(torch.multinomial(probabilities(logits, p), 1, generator=seq.sampler_state))


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
