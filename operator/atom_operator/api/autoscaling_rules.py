"""The rules of ``spec.autoscaling``: each a guard, a check and a message, in Python and in CEL (as
:mod:`atom_engine.limits` writes rules), so the webhook, the CRD and the operator refuse the same specs.

An admitted autoscaling spec can always be satisfied: the bounds are in order, the ratio band has a pair inside
them (:mod:`atom_operator.api.band`, the search written out below in CEL), the NPU budget fits the smallest such
pair, and prefill cannot reach zero workers while decode cannot prefill itself.
"""

from __future__ import annotations

from typing import Any

from atom_engine.limits import Rule, Term, cel_int_string

from atom_operator.api import band
from atom_operator.api.autoscaling import RATIO_TERM_MAX

A = "self.autoscaling"
HAS = f"has({A})"
HAS_PREFILL = f"{HAS} && has({A}.prefill)"
HAS_RATIO = f"{HAS} && has({A}.ratio)"

DMIN, DMAX = f"{A}.decode.minReplicas", f"{A}.decode.maxReplicas"
PMIN, PMAX = f"{A}.prefill.minReplicas", f"{A}.prefill.maxReplicas"
RMP, RMD, RXP, RXD = (f"{A}.ratio.{end}.{role}" for end in ("min", "max") for role in ("prefill", "decode"))
BUDGET = f"{A}.npuBudget"
NPU_D, NPU_P = "self.decode.npusPerReplica", "self.prefill.npusPerReplica"


def _max(a: str, b: str) -> str:
    return f"(({a}) > ({b}) ? ({a}) : ({b}))"


def _min(a: str, b: str) -> str:
    return f"(({a}) < ({b}) ? ({a}) : ({b}))"


# band.first_decode, band.prefill_range and the search of band.smallest_pair. CEL has no let: a value is bound
# by mapping a one-element list (``[x].map(v, ...)[0]``), which keeps each expression written once.
_FIRST = _max(DMIN, f"({RXD} * {PMIN} + {RXP} - 1) / {RXP}")
_OFFSETS = "[" + ", ".join(str(i) for i in range(RATIO_TERM_MAX)) + "]"
_CANDIDATES = f"[{_FIRST}].map(s, {_OFFSETS}.filter(i, i < {RMD}).map(i, s + i))[0]"  # the decode counts to try
_LO_D = _max(PMIN, f"({RMP} * d + {RMD} - 1) / {RMD}")
_HI_D = _min(PMAX, f"{RXP} * d / {RXD}")
_FITS_D = f"d <= {DMAX} && {_LO_D} <= {_HI_D}"
REACHABLE_CEL = f"{_CANDIDATES}.exists(d, {_FITS_D})"
_CHEAPEST_BAND_CEL = f"{_CANDIDATES}.filter(d, {_FITS_D}).map(d, d * {NPU_D} + {_LO_D} * {NPU_P})[0]"
_PREFILL_FLOOR_CEL = f"(has({A}.prefill) ? {PMIN} : self.prefill.replicas)"
CHEAPEST_CEL = f"(has({A}.ratio) ? {_CHEAPEST_BAND_CEL} : {DMIN} * {NPU_D} + {_PREFILL_FLOOR_CEL} * {NPU_P})"
BOUNDS_ORDERED_CEL = f"{DMIN} <= {DMAX} && (!has({A}.prefill) || {PMIN} <= {PMAX})"
ORDERED_CEL = f"{RMP} * {RXD} <= {RXP} * {RMD}"


def bounds(v: Any) -> band.Bounds:
    a = v.autoscaling
    prefill = a.prefill
    lo, hi = (prefill.min_replicas, prefill.max_replicas) if prefill else (v.prefill_replicas, v.prefill_replicas)
    return band.Bounds(a.decode.min_replicas, a.decode.max_replicas, lo, hi)


def ratio_band(v: Any) -> band.Band | None:
    r = v.autoscaling.ratio
    return None if r is None else band.Band(r.min.prefill, r.min.decode, r.max.prefill, r.max.decode)


def cheapest(v: Any) -> int:
    """NPUs of the smallest pair inside the bounds and the band (the guard made sure there is one)."""
    pair = band.smallest_pair(bounds(v), ratio_band(v))
    assert pair is not None
    return pair[1] * v.decode_npus + pair[0] * v.prefill_npus


def _bounds_ordered(v: Any) -> bool:
    b = bounds(v)
    return b.decode_min <= b.decode_max and b.prefill_min <= b.prefill_max


def _reachable(v: Any) -> bool:
    return band.smallest_pair(bounds(v), ratio_band(v)) is not None


def _t(py: Any, cel: str, *, string: bool = False, boolean: bool = False) -> Term:
    return Term(py, cel, string, boolean)


_A = lambda v: v.autoscaling  # noqa: E731
D_MIN = _t(lambda v: _A(v).decode.min_replicas, DMIN)
D_MAX = _t(lambda v: _A(v).decode.max_replicas, DMAX)
P_MIN = _t(lambda v: _A(v).prefill.min_replicas, PMIN)
P_MAX = _t(lambda v: _A(v).prefill.max_replicas, PMAX)
R_MIN_P = _t(lambda v: _A(v).ratio.min.prefill, RMP)
R_MIN_D = _t(lambda v: _A(v).ratio.min.decode, RMD)
R_MAX_P = _t(lambda v: _A(v).ratio.max.prefill, RXP)
R_MAX_D = _t(lambda v: _A(v).ratio.max.decode, RXD)
_BAND_TEXT: list[Any] = [R_MIN_P, ":", R_MIN_D, " to ", R_MAX_P, ":", R_MAX_D]

RULES: tuple[Rule, ...] = (
    Rule(
        id="autoscaling-decode-bounds",
        field="autoscaling.decode.minReplicas",
        applies=_t(lambda v: _A(v) is not None, HAS),
        holds=_t(lambda v: _A(v).decode.min_replicas <= _A(v).decode.max_replicas, f"{DMIN} <= {DMAX}"),
        message=["autoscaling.decode.minReplicas must be <= autoscaling.decode.maxReplicas = ", D_MAX, "; got ", D_MIN],
        scope="spec",
    ),
    Rule(
        id="autoscaling-prefill-bounds",
        field="autoscaling.prefill.minReplicas",
        applies=_t(lambda v: _A(v) is not None and _A(v).prefill is not None, HAS_PREFILL),
        holds=_t(lambda v: _A(v).prefill.min_replicas <= _A(v).prefill.max_replicas, f"{PMIN} <= {PMAX}"),
        message=[
            "autoscaling.prefill.minReplicas must be <= autoscaling.prefill.maxReplicas = ",
            P_MAX,
            "; got ",
            P_MIN,
        ],
        scope="spec",
    ),
    Rule(
        id="autoscaling-prefill-min-remote",
        field="autoscaling.prefill.minReplicas",
        applies=_t(
            lambda v: _A(v) is not None and _A(v).prefill is not None and not v.local_prefill,
            f"{HAS_PREFILL} && !self.decode.localPrefill",
        ),
        holds=_t(lambda v: _A(v).prefill.min_replicas >= 1, f"{PMIN} >= 1"),
        message=[
            "autoscaling.prefill.minReplicas must be >= 1 while decode.localPrefill is false (decode pods cannot"
            " prefill, so with no worker every request would fail); got ",
            P_MIN,
        ],
        scope="spec",
    ),
    Rule(
        id="autoscaling-ratio-needs-prefill",
        field="autoscaling.ratio",
        applies=_t(lambda v: _A(v) is not None and _A(v).ratio is not None, HAS_RATIO),
        holds=_t(lambda v: _A(v).prefill is not None, f"has({A}.prefill)"),
        message=["autoscaling.ratio needs autoscaling.prefill (a band between the roles needs both roles scaled)"],
        scope="spec",
    ),
    Rule(
        id="autoscaling-ratio-order",
        field="autoscaling.ratio",
        applies=_t(lambda v: _A(v) is not None and _A(v).ratio is not None, HAS_RATIO),
        holds=_t(lambda v: ratio_band(v).ordered(), ORDERED_CEL),
        message=["autoscaling.ratio.min must not exceed autoscaling.ratio.max (prefill:decode); got ", *_BAND_TEXT],
        scope="spec",
    ),
    Rule(
        id="autoscaling-ratio-reachable",
        field="autoscaling.ratio",
        applies=_t(
            lambda v: (
                _A(v) is not None
                and _A(v).ratio is not None
                and _A(v).prefill is not None
                and ratio_band(v).ordered()
                and _bounds_ordered(v)
            ),
            f"{HAS_RATIO} && has({A}.prefill) && {ORDERED_CEL} && {BOUNDS_ORDERED_CEL}",
        ),
        holds=_t(_reachable, REACHABLE_CEL),
        message=[
            "autoscaling.ratio cannot be met inside the replica bounds: no decode count from ",
            D_MIN,
            " to ",
            D_MAX,
            " has a prefill count from ",
            P_MIN,
            " to ",
            P_MAX,
            " with prefill:decode from ",  # fmt: skip
            *_BAND_TEXT,
        ],
        scope="spec",
    ),
    Rule(
        id="autoscaling-npu-budget",
        field="autoscaling.npuBudget",
        applies=_t(
            lambda v: (
                _A(v) is not None
                and _A(v).npu_budget is not None
                and _bounds_ordered(v)
                and (_A(v).ratio is None or (_A(v).prefill is not None and ratio_band(v).ordered() and _reachable(v)))
            ),
            f"{HAS} && has({A}.npuBudget) && {BOUNDS_ORDERED_CEL}"
            f" && (!has({A}.ratio) || (has({A}.prefill) && {ORDERED_CEL} && {REACHABLE_CEL}))",
        ),
        holds=_t(lambda v: cheapest(v) <= _A(v).npu_budget, f"{CHEAPEST_CEL} <= {BUDGET}"),
        message=[
            "autoscaling.npuBudget must be >= ",
            # printed from a bound variable: the digits read it many times, the expression is written once
            _t(cheapest, f"[{CHEAPEST_CEL}].map(n, {cel_int_string('n')})[0]", string=True),
            ", the NPUs of the fewest pods the bounds and the ratio allow (decode pods x decode.npusPerReplica +"
            " prefill workers x prefill.npusPerReplica); got ",
            _t(lambda v: _A(v).npu_budget, BUDGET),
        ],
        scope="spec",
    ),
    Rule(
        id="autoscaling-slo-needs-prefill",
        field="autoscaling.slo",
        applies=_t(lambda v: _A(v) is not None and _A(v).slo is not None, f"{HAS} && has({A}.slo)"),
        holds=_t(lambda v: _A(v).prefill is not None, f"has({A}.prefill)"),
        message=["autoscaling.slo needs autoscaling.prefill (the SLO sizes the prefill workers)"],
        scope="spec",
    ),
    Rule(
        id="autoscaling-slo-or-utilization",
        field="autoscaling.prefill.targetUtilizationPercent",
        applies=_t(
            lambda v: _A(v) is not None and _A(v).slo is not None and _A(v).prefill is not None,
            f"{HAS} && has({A}.slo) && has({A}.prefill)",
        ),
        holds=_t(
            lambda v: _A(v).prefill.target_utilization_percent is None, f"!has({A}.prefill.targetUtilizationPercent)"
        ),
        message=[
            "autoscaling.prefill.targetUtilizationPercent must be unset when autoscaling.slo is set (the SLO"
            " derives it); got ",
            _t(lambda v: _A(v).prefill.target_utilization_percent, f"{A}.prefill.targetUtilizationPercent"),
        ],
        scope="spec",
    ),
)
