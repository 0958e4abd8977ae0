"""What the decision needs from an AtomDeployment's spec, in its own units (fractions and seconds)."""

from __future__ import annotations

from dataclasses import dataclass

from atom_operator.api.autoscaling_rules import bounds as _spec_bounds
from atom_operator.api.autoscaling_rules import ratio_band as _spec_band
from atom_operator.api.band import Band, Bounds
from atom_operator.api.spec import AtomDeploymentSpec
from atom_operator.npu import npus_requested

# The busy share a prefill worker is sized for when neither the spec nor an SLO says (the design's default).
DEFAULT_UTILIZATION = 0.70
# Utilization derived from an SLO is kept inside this range: at 0 no worker count suffices, near 1 the queue's
# wait is unbounded.
UTILIZATION_RANGE = (0.05, 0.95)


@dataclass(frozen=True)
class Policy:
    mode: str  # "Operator" or "External"
    interval_seconds: float
    lanes: int
    bounds: Bounds  # prefill_min == prefill_max == spec.prefill.replicas when prefill is not autoscaled
    prefill_scaled: bool
    occupancy: float  # decode's target lane occupancy, 0..1
    utilization: float | None  # prefill's target busy share; None: derived from ttft_seconds
    ttft_seconds: float | None
    tokens_per_second_hint: float | None
    band: Band | None
    npu_budget: int | None
    npus_decode: int
    npus_prefill: int
    tolerance: float
    up_window: float
    up_pods: int
    down_window: float
    down_pods: int
    # Off: each role sized from its own pods only (decode on raw occupancy, prefill on its served work), as
    # per-role autoscalers do; the benchmark's baseline, not an API field.
    coupled: bool = True

    def cost(self, prefill: int, decode: int) -> int:
        return decode * self.npus_decode + prefill * self.npus_prefill


def policy(spec: AtomDeploymentSpec, *, coupled: bool = True) -> Policy:
    """The policy of ``spec.autoscaling`` (which must be set and admitted: the rules hold)."""
    a = spec.autoscaling
    if a is None:
        raise ValueError("spec.autoscaling is not set")
    view = spec.view()
    prefill = a.prefill
    utilization = None
    if a.slo is None:
        utilization = (prefill.target_utilization_percent or DEFAULT_UTILIZATION * 100) / 100 if prefill else None
    return Policy(
        mode=a.mode,
        interval_seconds=float(a.interval_seconds),
        lanes=spec.decode.lanes,
        bounds=_spec_bounds(view),
        prefill_scaled=prefill is not None,
        occupancy=a.decode.target_occupancy_percent / 100,
        utilization=utilization,
        ttft_seconds=a.slo.ttft_milliseconds / 1000 if a.slo else None,
        tokens_per_second_hint=float(prefill.tokens_per_second_hint)
        if prefill and prefill.tokens_per_second_hint
        else None,
        band=_spec_band(view),
        npu_budget=a.npu_budget,
        # What each pod's template requests (the same function builds it): the budget counts the pods' own NPUs.
        npus_decode=npus_requested(spec.decode),
        npus_prefill=npus_requested(spec.prefill),
        tolerance=a.behavior.tolerance_percent / 100,
        up_window=float(a.behavior.scale_up.stabilization_window_seconds),
        up_pods=a.behavior.scale_up.max_pods_per_interval,
        down_window=float(a.behavior.scale_down.stabilization_window_seconds),
        down_pods=a.behavior.scale_down.max_pods_per_interval,
        coupled=coupled,
    )
