"""Sampling filters: temperature, then top-k, then top-p."""

from __future__ import annotations

import pytest
import torch
from atom_engine.sampling import probabilities, sample
from atom_engine.sequence import SamplingParams, Sequence

LOGITS = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])


def test_top_k_keeps_the_k_largest() -> None:
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert (p[2:] == 0).all() and torch.allclose(p[:2].sum(), torch.tensor(1.0))


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    full = torch.softmax(LOGITS, -1)
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=float(full[0] + full[1]) - 1e-4))
    assert (p[:2] > 0).all() and (p[2:] == 0).all()
    assert (probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.01)) > 0).sum() == 1


def test_temperature_sharpens() -> None:
    cold = probabilities(LOGITS, SamplingParams(temperature=0.5))
    warm = probabilities(LOGITS, SamplingParams(temperature=2.0))
    assert cold[0] > warm[0]


def draw(seq: Sequence, count: int) -> list[int]:
    """``count`` tokens, each taken into the output as the engine does (a draw is made once per output position)."""
    for _ in range(count):
        seq.output.append(sample(LOGITS, seq))
    return list(seq.output)


def test_same_seed_same_draws() -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    draws = [draw(s, 20) for s in (Sequence("a", [1], params), Sequence("b", [1], params))]
    assert draws[0] == draws[1] and len(set(draws[0])) > 1


def test_a_position_drawn_again_draws_the_same_token() -> None:
    """A batch that failed is retried lane by lane: a lane that had drawn in it draws the same token again, and
    the draws after it are the ones it would have made."""
    params = SamplingParams(temperature=1.0, seed=7)
    once, again = Sequence("a", [1], params), Sequence("b", [1], params)
    draw(once, 3)
    draw(again, 2)
    retried = [sample(LOGITS, again) for _ in range(3)]  # the failed batch's draw, then two retries
    assert retried == [once.output[2]] * 3
    again.output.append(retried[-1])
    assert draw(once, 10) == draw(again, 10)


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=-1)])
def test_invalid_params_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)
