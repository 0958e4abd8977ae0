"""The prefill:decode band inside the replica bounds: which pairs are allowed, and the smallest one.

A band is ``min.prefill/min.decode <= P/D <= max.prefill/max.decode``, cross-multiplied so that everything stays an
integer. For a decode count D the allowed prefill counts are an interval; they are empty for some D (a band of
2:5..1:2 has no prefill count for D = 1), so whether the bounds can reach the band at all is a search over D. That
search is short: the decode counts that work form one interval [lo, hi], and every multiple of ``min.decode`` in
it works (P = D * min.prefill / min.decode exactly), so the smallest that works is among the first ``min.decode``
counts from lo. The same arithmetic is written twice, here and as CEL in :mod:`atom_operator.api.autoscaling_rules`,
and tests hold both to a brute-force search.
"""

from __future__ import annotations

from dataclasses import dataclass


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Band:
    """``min_prefill:min_decode <= P:D <= max_prefill:max_decode``; every term >= 1."""

    min_prefill: int
    min_decode: int
    max_prefill: int
    max_decode: int

    def ordered(self) -> bool:
        return self.min_prefill * self.max_decode <= self.max_prefill * self.min_decode

    def contains(self, prefill: int, decode: int) -> bool:
        return prefill * self.min_decode >= self.min_prefill * decode and prefill * self.max_decode <= (
            self.max_prefill * decode
        )

    def prefill_for(self, decode: int) -> tuple[int, int]:
        """The prefill counts the band allows beside ``decode`` pods (empty when lo > hi)."""
        return ceil_div(self.min_prefill * decode, self.min_decode), self.max_prefill * decode // self.max_decode

    def decode_for(self, prefill: int) -> tuple[int, int]:
        """The decode counts the band allows beside ``prefill`` workers (empty when lo > hi)."""
        return ceil_div(self.max_decode * prefill, self.max_prefill), self.min_decode * prefill // self.min_prefill


@dataclass(frozen=True)
class Bounds:
    decode_min: int
    decode_max: int
    prefill_min: int
    prefill_max: int

    def contains(self, prefill: int, decode: int) -> bool:
        return self.prefill_min <= prefill <= self.prefill_max and self.decode_min <= decode <= self.decode_max


def prefill_range(decode: int, bounds: Bounds, band: Band | None) -> tuple[int, int]:
    """Prefill counts allowed beside ``decode`` pods: the bounds, narrowed by the band (empty when lo > hi)."""
    lo, hi = bounds.prefill_min, bounds.prefill_max
    if band is not None:
        band_lo, band_hi = band.prefill_for(decode)
        lo, hi = max(lo, band_lo), min(hi, band_hi)
    return lo, hi


def first_decode(bounds: Bounds, band: Band) -> int:
    """The smallest decode count whose band reaches prefill_min: below it even prefill_min is too many."""
    return max(bounds.decode_min, ceil_div(band.max_decode * bounds.prefill_min, band.max_prefill))


def smallest_pair(bounds: Bounds, band: Band | None) -> tuple[int, int] | None:
    """The allowed (prefill, decode) with the fewest pods of both roles, None when the band is out of reach.

    The smallest allowed decode count also has the smallest allowed prefill count (both ends of the band's
    interval grow with D), so it is the pair that needs the fewest NPUs too.
    """
    if bounds.prefill_min > bounds.prefill_max or bounds.decode_min > bounds.decode_max:
        return None
    if band is None:
        return bounds.prefill_min, bounds.decode_min
    start = first_decode(bounds, band)
    for decode in range(start, min(start + band.min_decode, bounds.decode_max + 1)):
        lo, hi = prefill_range(decode, bounds, band)
        if lo <= hi:
            return lo, decode
    return None
