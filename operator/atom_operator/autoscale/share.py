"""The pair of replica counts closest to both roles' targets within the bounds, the ratio band, the NPU budget and
the cluster's room: water-filling, the larger share of the worse-served role's target first, then of the other's,
then the cheaper pair. No I/O."""

from __future__ import annotations

from atom_operator.api.band import prefill_range
from atom_operator.autoscale.policy import Policy
from atom_operator.autoscale.room import units


def share(
    targets: tuple[int, int], policy: Policy, decode_ceiling: bool, room_left: int | None = None
) -> tuple[tuple[int, int], str]:
    """The allowed pair closest to the targets: the band, the budget and the cluster's room (``room_left`` units),
    shared out by water-filling."""
    p_t, d_t = targets
    b = policy.bounds
    best: tuple[tuple[float, float, int, int, int], tuple[int, int]] | None = None
    # External: the HPA's count is a ceiling the band or the budget may lower, and raise only if nothing below fits.
    decodes = range(b.decode_min, (d_t if decode_ceiling else b.decode_max) + 1)
    for d in decodes:
        lo, hi = prefill_range(d, b, policy.band)
        if policy.npu_budget is not None:
            room = policy.npu_budget - d * policy.npus_decode
            if room < 0:
                continue
            if policy.npus_prefill:
                hi = min(hi, room // policy.npus_prefill)
        if room_left is not None:
            if room_left < units(policy, 0, d):
                continue
            if units(policy, 1, 0):
                hi = min(hi, (room_left - units(policy, 0, d)) // units(policy, 1, 0))
        if lo > hi:
            continue
        p = min(hi, max(lo, p_t))
        # Max-min, then the better-served role: where one role's share is capped (a bound below its target), every
        # count of the other covers the same worst share, and the cheapest would take it below its own target.
        shares = sorted((min(1.0, p / p_t) if p_t else 1.0, min(1.0, d / d_t) if d_t else 1.0))
        key = (-shares[0], -shares[1], policy.cost(p, d), p + d, abs(d - d_t))
        if best is None or key < best[0]:
            best = (key, (p, d))
    if best is None and room_left is not None:  # no allowed pair fits the room: the spec (and the HPA) win
        return share(targets, policy, decode_ceiling)
    if best is None and decode_ceiling:  # no pair at or below the HPA's count: the band and the budget win
        return share(targets, policy, decode_ceiling=False)
    assert best is not None, "admission guarantees a pair inside the bounds, the band and the budget"
    pair = best[1]
    if pair == targets:
        return pair, ""
    bound = npu_bound(targets, policy, room_left)
    if bound:
        return pair, bound
    in_band = policy.band is None or policy.band.contains(p_t, d_t)
    return pair, ("RatioAdjusted" if not in_band else "Adjusted")


def npu_bound(targets: tuple[int, int], policy: Policy, room: int | None) -> str:
    """Which NPU bound the pair exceeds, the cluster's room before the budget; '' for neither."""
    if room is not None and units(policy, *targets) > room:
        return "InsufficientNPUs"
    if policy.npu_budget is not None and policy.cost(*targets) > policy.npu_budget:
        return "NPUBudget"
    return ""
