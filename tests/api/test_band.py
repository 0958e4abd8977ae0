"""The band arithmetic the autoscaling rules and the decision share, held to a brute-force search."""

from __future__ import annotations

from atom_operator.api import band
from atom_operator.api.autoscaling import RATIO_TERM_MAX
from hypothesis import given, settings
from hypothesis import strategies as st

TERM = st.integers(1, RATIO_TERM_MAX)
COUNT = st.integers(0, 40)


@st.composite
def cases(draw: st.DrawFn) -> tuple[band.Bounds, band.Band]:
    dmin, dmax = sorted((draw(st.integers(1, 40)), draw(st.integers(1, 40))))
    pmin, pmax = sorted((draw(COUNT), draw(COUNT)))
    b = band.Band(draw(TERM), draw(TERM), draw(TERM), draw(TERM))
    return band.Bounds(dmin, dmax, pmin, pmax), b


def _pairs(bounds: band.Bounds, b: band.Band) -> list[tuple[int, int]]:
    return [
        (p, d)
        for d in range(bounds.decode_min, bounds.decode_max + 1)
        for p in range(bounds.prefill_min, bounds.prefill_max + 1)
        if b.contains(p, d)
    ]


@settings(max_examples=3000, deadline=None)
@given(cases())
def test_smallest_pair_is_the_brute_force_smallest(case: tuple[band.Bounds, band.Band]) -> None:
    bounds, b = case
    pairs = _pairs(bounds, b)
    found = band.smallest_pair(bounds, b)
    if not pairs:
        assert found is None
        return
    assert found is not None and bounds.contains(*found) and b.contains(*found)
    # The fewest decode pods, and beside them the fewest prefill workers; no allowed pair has fewer of either.
    assert found == min(pairs, key=lambda pd: (pd[1], pd[0]))
    assert all(p >= found[0] for p, _ in pairs)


@settings(max_examples=2000, deadline=None)
@given(cases(), st.integers(1, 40))
def test_prefill_range_is_every_allowed_prefill_count(case: tuple[band.Bounds, band.Band], decode: int) -> None:
    bounds, b = case
    lo, hi = band.prefill_range(decode, bounds, b)
    allowed = [p for p in range(bounds.prefill_min, bounds.prefill_max + 1) if b.contains(p, decode)]
    assert allowed == list(range(lo, hi + 1))
    dlo, dhi = b.decode_for(max(lo, 1))
    if allowed and lo >= 1:
        assert dlo <= decode <= dhi  # the inverse view agrees


def test_a_band_with_real_but_no_integer_pairs() -> None:
    # 4:9..1:2 allows 1.33..1.5 prefill workers for 3 decode pods: real ratios, no integer one.
    assert band.smallest_pair(band.Bounds(3, 3, 1, 4), band.Band(4, 9, 1, 2)) is None
    assert band.smallest_pair(band.Bounds(1, 4, 1, 4), band.Band(2, 5, 1, 2)) == (1, 2)
