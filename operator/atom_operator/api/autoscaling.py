"""``spec.autoscaling``: one decision sizes decode and prefill together, inside bounds, a ratio band and a budget.

Percentages and integer pairs, not floats, per the Kubernetes API conventions; a ratio is a pair of small integers
(prefill:decode) so that ``1:4`` means what it says (no ``resource.Quantity`` suffixes). The rules between these
fields (bounds in order, a band the bounds can reach, a budget the smallest admitted pair fits) are in
:mod:`atom_operator.api.autoscaling_rules`, one definition each for the webhook, CEL and the operator.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from atom_operator.api.fields import Strict

# Replica bounds of an autoscaled role. Smaller than spec.<role>.replicas' bound so that every product the rules
# print (replicas x npusPerReplica x 2 roles) stays within the 5 digits a CEL message can print.
AUTOSCALE_REPLICAS_MAX = 512
# A ratio's terms: small integers, so the band check only has to try this many decode counts (see band.py).
RATIO_TERM_MAX = 16
WINDOW_SECONDS_MAX = 3600
DRAIN_TIMEOUT_SECONDS_MAX = 86400

Mode = Literal["Off", "Operator", "External"]


class DecodeScaling(Strict):
    """Bounds and target of the decode role."""

    min_replicas: int = Field(
        1,
        ge=1,
        le=AUTOSCALE_REPLICAS_MAX,
        description="Fewest decode pods, >= 1 (nothing would hold requests at zero).",
    )
    max_replicas: int = Field(ge=1, le=AUTOSCALE_REPLICAS_MAX, description="Most decode pods.")
    target_occupancy_percent: int = Field(
        80,
        ge=1,
        le=100,
        description="Lane occupancy a decode pod is sized for: (running + waiting - lanes waiting for a remote KV)"
        " / lanes. A decode pod's concurrency is its compiled lanes, so occupancy, not latency, is its load.",
    )


class PrefillScaling(Strict):
    """Bounds and target of the prefill workers; absent, prefill keeps spec.prefill.replicas."""

    min_replicas: int = Field(
        1,
        ge=0,
        le=AUTOSCALE_REPLICAS_MAX,
        description="Fewest prefill workers; >= 1 while decode.localPrefill is false (decode cannot prefill).",
    )
    max_replicas: int = Field(ge=1, le=AUTOSCALE_REPLICAS_MAX, description="Most prefill workers.")
    target_utilization_percent: int | None = Field(
        None,
        ge=1,
        le=100,
        description="Busy share of a worker's time it is sized for (a worker computes one prompt at a time)."
        " Default 70, or derived from slo.ttftMilliseconds when that is set (then leave this unset).",
    )
    tokens_per_second_hint: int | None = Field(
        None,
        ge=1,
        le=10**7,
        description="Prompt tokens per busy second one worker computes, used until the workers' own counters"
        " have measured it.",
    )


class Slo(Strict):
    """A latency objective the prefill target is derived from."""

    ttft_milliseconds: int = Field(
        ge=1,
        le=600_000,
        description="Time to first token to keep: the prefill queue may hold a prompt for what remains after its"
        " own compute, and the workers' utilization target follows from that (one prompt at a time per worker).",
    )


class RatioTerm(Strict):
    """A prefill:decode replica ratio as two small integers."""

    prefill: int = Field(ge=1, le=RATIO_TERM_MAX, description="Prefill workers of the ratio.")
    decode: int = Field(ge=1, le=RATIO_TERM_MAX, description="Decode pods of the ratio.")


class RatioBand(Strict):
    """Prefill:decode replica ratios the decision keeps to, both ends inclusive."""

    min: RatioTerm = Field(description="Fewest prefill workers per decode pod, e.g. {prefill: 1, decode: 4}.")
    max: RatioTerm = Field(description="Most prefill workers per decode pod, e.g. {prefill: 2, decode: 1}.")


class ScaleUp(Strict):
    """How fast a role grows."""

    stabilization_window_seconds: int = Field(
        0,
        ge=0,
        le=WINDOW_SECONDS_MAX,
        description="Grow only to the smallest recommendation of this window (0: act on the latest at once).",
    )
    max_pods_per_interval: int = Field(
        2, ge=1, le=AUTOSCALE_REPLICAS_MAX, description="Most pods a role gains in one decision."
    )


class ScaleDown(Strict):
    """How fast a role shrinks."""

    stabilization_window_seconds: int = Field(
        300,
        ge=0,
        le=WINDOW_SECONDS_MAX,
        description="Shrink only to the largest recommendation of this window, and not within it after the"
        " operator started (its history is empty then).",
    )
    max_pods_per_interval: int = Field(
        1, ge=1, le=AUTOSCALE_REPLICAS_MAX, description="Most pods a role loses (drains) in one decision."
    )


class Behavior(Strict):
    """Tolerance and pace of changes, as HPA's behavior."""

    tolerance_percent: int = Field(
        10, ge=0, le=100, description="A role changes only when its need differs from its count by more than this."
    )
    scale_up: ScaleUp = Field(default_factory=ScaleUp, json_schema_extra={"default": {}}, description=ScaleUp.__doc__)
    scale_down: ScaleDown = Field(
        default_factory=ScaleDown, json_schema_extra={"default": {}}, description=ScaleDown.__doc__
    )


class Drain(Strict):
    """How a pod leaves: cordoned (no new requests), deleted once idle."""

    timeout_seconds: int = Field(
        600,
        ge=1,
        le=DRAIN_TIMEOUT_SECONDS_MAX,
        description="A cordoned pod is removed when its engine reports idle, or after this long.",
    )


class AutoscalingSpec(Strict):
    """Replicas of both roles from one decision (Operator) or decode's from an HPA/KEDA (External)."""

    mode: Mode = Field(
        "Off",
        description="Off: spec.<role>.replicas as written. Operator: the operator sizes both roles from the pods'"
        " own metrics. External: spec.decode.replicas is written by an HPA or KEDA through the scale subresource"
        " and prefill follows it inside the ratio band. Either way a pod is removed only after it drained.",
    )
    interval_seconds: int = Field(15, ge=1, le=WINDOW_SECONDS_MAX, description="Seconds between decisions.")
    decode: DecodeScaling = Field(description=DecodeScaling.__doc__)
    prefill: PrefillScaling | None = Field(None, description=PrefillScaling.__doc__)
    slo: Slo | None = Field(None, description=Slo.__doc__)
    ratio: RatioBand | None = Field(None, description=RatioBand.__doc__)
    npu_budget: int | None = Field(
        None,
        ge=0,
        le=99_999,
        description="Most NPUs both roles hold together (replicas x npusPerReplica, of any kind); the decision"
        " shares it out in proportion to each role's need.",
    )
    behavior: Behavior = Field(
        default_factory=Behavior, json_schema_extra={"default": {}}, description=Behavior.__doc__
    )
    drain: Drain = Field(default_factory=Drain, json_schema_extra={"default": {}}, description=Drain.__doc__)
