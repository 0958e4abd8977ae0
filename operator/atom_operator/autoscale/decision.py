"""The decision: replicas for decode and prefill together, from what the pods reported. No I/O.

``decide(observations, state, policy, now)`` returns the desired pair, the conditions and the state to pass next
time. In order:

1. **Need per role, from arrivals.** Arrival rates are read over a window cut at change points
   (:mod:`~atom_operator.autoscale.arrivals`): a Poisson clump is not load, a step is. Decode: the lanes the
   arrivals will hold, max_tokens arriving per second x the lane seconds per max_token of the requests that ended,
   plus the lanes held while workers compute their prompts (after a step the window's rates; in a steady load the
   regime's, a floor under the lanes decoding now), over lanes x occupancy target. A longer wait for a remote KV,
   and requests queued behind it, are prefill's shortfall, not decode's; an engine that does not report max_tokens
   falls back to running + waiting less the lanes waiting for KV. Prefill: prompt tokens per second *arriving at
   decode pods* plus the workers' backlog beyond what they clear at full speed within the span the arrivals are
   read over (a queue after a step counts whole), over the tokens per busy second a worker computes (measured
   from its own counters) x its utilization target.
   Arrivals, not served rates, so a load step that needs both roles moves both in the same decision (a served
   rate would only rise after the other role had grown and let more through).
2. **Targets are absolute counts**, compared with the role's current replicas, pods not yet Ready included: a slow
   NPU start is not seen as missing capacity, so there is no +1, +1, +1 cascade.
3. **Missing data holds** (fail-static): a role whose Ready pods did not mostly answer keeps its count, except that
   what the answering pods alone show can still grow it.
4. **Tolerance, windows, pace**, as HPA: a need within the tolerance keeps the count; growing goes to the smallest
   recommendation of the up window, shrinking to the largest of the down window (and not before one down window
   after the operator started); at most so many pods per decision.
5. **Band and budget, jointly**: among the pairs inside the bounds, the ratio band and the NPU budget, the one that
   covers the larger share of both roles' targets (water-filling: max of min(got/target)), then the larger share
   of the other role's, then the cheapest.
   Scale-up biased: with a pair that meets both targets, nothing is lowered.
6. **What the cluster holds**: once pods stay Pending as unschedulable, the NPUs of the ones placed (a pod that
   requests none, on the cpu backend, counting as one) become a second budget for a while (:mod:`.room`),
   shared the same way: the stuck pods are given up, a role may take NPUs the other frees, and nothing asks for
   pods that cannot run (``ScalingLimited/InsufficientNPUs``). A stuck pod a role's down window keeps beyond its
   recommendation is no claim on the room (it serves nothing). When the memory lapses, or the nodes' NPUs grow,
   the decision asks again, as a probe, which the scheduler's first attempt answers; a probe that finds no more
   room doubles the memory. Where the room or the budget cannot hold both
   roles' recommendations and decode's lanes waited for prefill within its down window, decode gives prefill its
   headroom: its recommendation is taken at full occupancy, never fewer pods than the lanes its requests hold
   (before step 4, so lowering decode for it waits for its down window, and so does undoing it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from atom_operator.autoscale import arrivals
from atom_operator.autoscale.arrivals import Rates, Window
from atom_operator.autoscale.arrivals import window_seconds as arrivals_window_seconds
from atom_operator.autoscale.observations import DecodeObservation, Observations, PrefillObservation, RoleObservation
from atom_operator.autoscale.policy import UTILIZATION_RANGE, Policy
from atom_operator.autoscale.room import Room, claim, learn, stuck_pods, units
from atom_operator.autoscale.share import npu_bound, share

# An answered share of the Ready pods below this holds the role (HPA ignores a metric with too few pods too).
ANSWERED_SHARE_MIN = 0.5
# Busy seconds below this in a window are too few to measure a worker's speed from.
MIN_BUSY_SECONDS = 0.5
# Weight of a new speed measurement against the previous estimate.
SPEED_SMOOTHING = 0.5


@dataclass(frozen=True)
class State:
    """What the next decision needs from this one."""

    started: float | None = None
    history: dict[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)  # role -> (time, rec)
    last_scale: dict[str, float] = field(default_factory=dict)  # role -> when its desired count last changed
    desired: dict[str, int] = field(default_factory=dict)  # role -> the last decision's count
    tokens_per_busy_second: float | None = None  # a prefill worker's speed, smoothed
    arrivals: Window = field(default_factory=Window)
    capacity: Room | None = None  # the last room seen, kept after it lapses to tell what a probe found
    waited_for_prefill: float | None = None  # when decode's lanes last waited for a prefill worker
    shared: dict[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)  # role -> (time, shared count)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class RoleDecision:
    current: int
    recommended: int  # from its own need and bounds, before windows, pace, band and budget
    desired: int
    demand: str
    load: float | None = None  # the demand in the role's units (sequences; prefill: tok/s or busy seconds/s)


@dataclass(frozen=True)
class Decision:
    decode: RoleDecision
    prefill: RoleDecision | None
    reason: str
    conditions: tuple[Condition, ...]
    state: State
    scaled: tuple[str, ...] = ()  # roles this decision gave a new desired count (their lastScaleTime is now)

    @property
    def changed(self) -> bool:
        """A desired count differs from the current one (also while a drain carries out an earlier decision)."""
        return any(r is not None and r.desired != r.current for r in (self.decode, self.prefill))


@dataclass(frozen=True)
class _Need:
    load: float  # in the role's capacity units
    capacity: float  # of one pod
    floor_only: bool  # only some pods answered: the need may raise the count, never lower it
    demand: str
    for_prefill: float = 0.0  # of load, lanes held while prompts wait for or are computed by a worker


def _answered(obs: RoleObservation) -> str:
    """'' when enough pods answered, else why the role holds."""
    if obs.ready == 0:
        return "no Ready pod to read" if obs.replicas else ""
    if obs.answered < max(1, math.ceil(obs.ready * ANSWERED_SHARE_MIN)):
        return f"{obs.answered} of {obs.ready} Ready pods answered"
    return ""


def _decode_need(obs: DecodeObservation, policy: Policy, rates: Rates | None, speed: float | None) -> _Need:
    per_token = rates.seconds_per_max_token if rates else None
    if policy.coupled and rates and rates.max_tokens is not None and per_token and obs.running is not None:
        # A step: the window's rate, to grow before the lanes fill. A steady load: the lanes decoding, and the
        # arrivals over the regime a floor, at their mean while requests queue for a lane (the lanes decoding
        # cannot show more than there are), else read cautiously (a few long streams to a window are noise).
        # Queued for a lane: waiting at a pod whose every lane is held. One waiting beside a free lane is being
        # admitted; read as queued, a third stream waiting for its step on a pod of four lanes read the arrivals at
        # their mean and asked for a second pod.
        queued = obs.queued_for_lane > 0
        caution = 1.0 if queued else rates.steady_caution
        rate = rates.max_tokens if rates.stepping else (rates.steady_max_tokens or 0.0) * caution
        prompts = rates.prompt_tokens if rates.stepping else rates.steady_prompt_tokens * caution
        # A lane is held while a worker computes its prompt: that much of the remote wait is decode's own need
        # (the rest, queueing for a worker, is prefill's shortfall).
        computing = prompts / speed if speed else 0.0
        arriving = rate * per_token + computing
        decoding = max(0.0, obs.running - obs.waiting_for_kv) + min(obs.waiting_for_kv, computing)
        load = max(arriving, decoding)
        demand = f"{load:.1f} lanes ({arriving:.1f} arriving, {decoding:.0f} decoding"
        demand += f", {obs.waiting_for_kv:.0f} wait for prefill)" if obs.waiting_for_kv else ")"
        own = max(rate * per_token, obs.running - obs.waiting_for_kv, 0.0)
        return _Need(load, policy.lanes * policy.occupancy, obs.answered < obs.ready, demand, load - own)
    held = obs.waiting_for_kv if policy.coupled else 0.0
    load = max(0.0, obs.sequences - held)
    capacity = policy.lanes * policy.occupancy
    demand = f"{load:.1f} sequences" + (f" ({held:.1f} more wait for prefill)" if held else "")
    return _Need(load, capacity, obs.answered < obs.ready, demand)


def _speed(obs: PrefillObservation, state: State, policy: Policy) -> float | None:
    measured = obs.tokens_per_busy_second if obs.busy_seconds >= MIN_BUSY_SECONDS else None
    if measured is None or measured <= 0:
        return state.tokens_per_busy_second or policy.tokens_per_second_hint
    if state.tokens_per_busy_second is None:
        return measured
    return SPEED_SMOOTHING * measured + (1 - SPEED_SMOOTHING) * state.tokens_per_busy_second


def utilization_for_slo(ttft: float, service_seconds: float) -> float:
    """The busy share at which a worker's mean queue wait stays within what the TTFT leaves after the compute.

    One prompt at a time per worker, near-constant service time: M/D/1, mean wait rho*S / (2(1 - rho)) <= W gives
    rho <= 2W / (S + 2W), with W = TTFT - S.
    """
    wait = ttft - service_seconds
    lo, hi = UTILIZATION_RANGE
    if wait <= 0:
        return lo
    return min(hi, max(lo, 2 * wait / (service_seconds + 2 * wait)))


def _prefill_need(obs: Observations, speed: float | None, policy: Policy, rates: Rates | None) -> _Need | None:
    p, d = obs.prefill, obs.decode
    assert p is not None
    if rates is not None:
        arrivals, requests = rates.prompt_tokens, rates.requests
    else:
        arrivals, requests = d.arrived_tokens_per_second, d.arrived_requests_per_second
    if policy.ttft_seconds is not None and speed and arrivals and requests:
        service = arrivals / requests / speed
        utilization = utilization_for_slo(policy.ttft_seconds, service)
        backlog_window = clear_within = max(policy.ttft_seconds - service, policy.interval_seconds / 10)
    else:
        utilization = policy.utilization or UTILIZATION_RANGE[1]
        backlog_window = policy.interval_seconds
        # The span the rates were read over (one interval where the pods' counts were not windowed).
        clear_within = arrivals_window_seconds(policy.interval_seconds) if rates is not None else backlog_window
    if policy.coupled and speed and arrivals is not None and not _answered(d):
        # In a steady load a queue is a shortfall only where the workers there, at full speed beside the arrivals,
        # cannot clear it within the span the arrivals are read over: its prompts arrived within that span, so
        # the rate already holds them, and a prompt queued behind another (a Poisson clump) is not load. With an
        # SLO the span is what the TTFT leaves after the compute. Pods still starting count, as in the targets.
        # What is left counts within one interval. After a step the whole queue counts: the arrivals are read
        # cautiously then, and the queue is the step's first evidence.
        stepping = rates is not None and rates.stepping
        spare = 0.0 if stepping else max(0.0, (p.replicas - p.unschedulable) * speed - arrivals) * clear_within
        backlog = max(0.0, p.waiting_tokens - spare)
        load = arrivals + backlog / backlog_window
        demand = f"{arrivals:.0f} tok/s + {p.waiting_tokens:.0f} tok queued"
        if p.waiting_tokens and backlog < p.waiting_tokens:
            demand += f" ({backlog:.0f} beyond what the workers clear in {clear_within:.0f} s)"
        demand += f" at {speed:.0f} tok/s per worker"
        return _Need(load, speed * utilization, False, demand)
    if p.busy_seconds_per_second is not None and not _answered(p):
        busy = p.busy_seconds_per_second
        return _Need(busy, utilization, p.answered < p.ready, f"{busy:.2f} worker-seconds busy per second")
    return None


def _recommend(need: _Need | None, current: int, lo: int, hi: int, tolerance: float, heading: int | None = None) -> int:
    """The count the need asks for; within the tolerance of the count the role is heading to, that count.

    While a scale-down drains its victim, ``current`` still counts it and ``heading`` is the decision's count:
    a need at the edge of that count (one pod's capacity read a little above it) keeps it, where measured against
    ``current`` it would un-cordon the victim and cordon it again a window later."""
    if need is None:
        return min(hi, max(lo, current))
    exact = need.load / need.capacity
    toward = heading if heading is not None and 0 < heading < current else current
    if toward > 0 and abs(exact / toward - 1) <= tolerance:
        rec = toward
    else:
        rec = math.ceil(exact - 1e-9)
    if need.floor_only:
        rec = max(rec, current)
    return min(hi, max(lo, rec))


def _stabilize(
    role: str, rec: int, current: int, state: State, policy: Policy, now: float, hold_down: bool
) -> tuple[int, tuple[tuple[float, int], ...]]:
    """HPA's behaviour: up to the smallest recommendation of the up window, down to the largest of the down window."""
    keep = max(policy.up_window, policy.down_window)
    history = tuple((t, r) for t, r in state.history.get(role, ()) if now - t < keep) + ((now, rec),)
    up = min(r for t, r in history if now - t <= policy.up_window)
    down = max(r for t, r in history if now - t <= policy.down_window)
    started = state.started if state.started is not None else now
    stable = current
    if current < up:
        stable = up
    elif current > down and not hold_down and now - started >= policy.down_window:
        stable = down
    stable = min(current + policy.up_pods, max(current - policy.down_pods, stable))
    return stable, history


def _yield_to_prefill(
    recommended: tuple[int, int],
    need: _Need | None,
    obs: DecodeObservation,
    policy: Policy,
    room: int | None,
    hold: bool,
    heading: int | None,
    waited: bool,
) -> tuple[int, str]:
    """Decode's recommendation when the NPUs bind (and which bound binds): at full occupancy, its headroom given to
    prefill, while its lanes have waited for prefill within the down window. Those waits are prefill's shortfall
    showing in decode; where both roles' needs do not fit, an NPU kept for decode's headroom leaves the bottleneck
    as it is, and the same NPU given to prefill shortens the wait. Never fewer pods than the lanes decode's
    requests hold (within the tolerance, below): lanes held while a worker computes a prompt are decode's own (no
    worker count shortens one prompt), and a yield below them made decode the bottleneck instead (the
    pair then flips between the two ways of sharing the NPUs). A recommendation, not a target: lowering
    decode waits for its down window like any scale-down, and ``waited`` spans the window, so a reading with no
    lane waiting does not undo it at once.

    Full occupancy has the tolerance on top (a pod's lanes and a tenth): lanes held by prompts being computed swing
    by a lane or two between readings, and at one pod's lanes exactly the count read 1, 2, 1, 2, so the down
    window, which keeps the largest, never let the yield happen."""
    d_rec = recommended[1]
    bound = npu_bound(recommended, policy, room)
    if not bound or hold or need is None or not waited:
        return d_rec, ""
    b = policy.bounds
    full = _recommend(replace(need, capacity=policy.lanes * (1 + policy.tolerance)), obs.replicas, b.decode_min,
                      b.decode_max, policy.tolerance, heading)  # fmt: skip
    return (full, bound) if full < d_rec else (d_rec, "")


def hold_trades(
    pair: tuple[int, int],
    current: tuple[int, int],
    claims: tuple[int, int],
    state: State,
    policy: Policy,
    now: float,
    room: int | None,
) -> tuple[tuple[int, int], dict[str, tuple[tuple[float, int], ...]]]:
    """A trade obeys the giver's stabilization. Where sharing the room or the budget lowers a role below its
    current count and below its own stabilized count (``claims``), that is a scale-down of the role: it goes only to
    the largest count the sharing gave it over its own down window (and not within one window of the start), and
    the other role grows only into what the giver left. One interval's reading of the taker's need cannot cordon
    the giver's pod; a need that holds for the window can. Where holding the giver would leave the bounds or the
    band, the shared pair stands (they are limits, not behavior)."""
    history: dict[str, tuple[tuple[float, int], ...]] = {}
    out = list(pair)
    started = state.started if state.started is not None else now
    for i, role in enumerate(("prefill", "decode")):
        history[role] = tuple((t, n) for t, n in state.shared.get(role, ()) if now - t < policy.down_window) + (
            (now, pair[i]),
        )
        if pair[i] < min(current[i], claims[i]):
            keep = min(current[i], claims[i])
            out[i] = keep if now - started < policy.down_window else min(keep, max(n for _, n in history[role]))
    for taker in (0, 1):  # the role that grows takes only what the held giver leaves
        while out[taker] > current[taker] and not _fits(out, policy, room):
            out[taker] -= 1
    held = (out[0], out[1])
    allowed = policy.bounds.contains(*held) and (policy.band is None or policy.band.contains(*held))
    if held != pair and not (allowed and _fits(out, policy, room)):
        return pair, history
    return held, history


def _fits(pair: list[int], policy: Policy, room: int | None) -> bool:
    if policy.npu_budget is not None and policy.cost(*pair) > policy.npu_budget:
        return False
    return room is None or units(policy, *pair) <= room


def decide(obs: Observations, state: State, policy: Policy, now: float) -> Decision:
    """Both roles' replicas from this interval's observations (see the module's docstring)."""
    b = policy.bounds
    state = replace(state, started=state.started if state.started is not None else now)
    missing = {
        role: why for role, o in (("decode", obs.decode), ("prefill", obs.prefill)) if o and (why := _answered(o))
    }

    # 1-3: each role's need, from the arrivals decode saw.
    rates = None
    if obs.decode.counts is not None and policy.coupled:
        window, rates = arrivals.add(state.arrivals, obs.decode.counts, policy.interval_seconds)
        state = replace(state, arrivals=window)
    speed = _speed(obs.prefill, state, policy) if obs.prefill is not None else None
    external = policy.mode == "External" and obs.external_decode is not None
    d_cur = obs.decode.replicas
    if external:
        d_need = None
        d_rec = min(b.decode_max, max(b.decode_min, obs.external_decode or 0))
        d_demand = f"{d_rec} replicas from spec.decode.replicas (External)"
    else:
        unread = "decode" in missing and obs.decode.answered == 0
        d_need = None if unread else _decode_need(obs.decode, policy, rates, speed)
        d_rec = _recommend(d_need, d_cur, b.decode_min, b.decode_max, policy.tolerance, state.desired.get("decode"))
        d_demand = d_need.demand if d_need else "no data"

    p_rec = p_cur = b.prefill_min
    p_need = None
    if obs.prefill is not None:
        p_cur = obs.prefill.replicas
        if policy.prefill_scaled:
            p_need = _prefill_need(obs, speed, policy, rates)
            p_rec = _recommend(
                p_need, p_cur, b.prefill_min, b.prefill_max, policy.tolerance, state.desired.get("prefill")
            )
        else:
            p_cur = p_rec = b.prefill_min
    state = replace(state, tokens_per_busy_second=speed)

    # 6 first, for the yield: what the cluster showed it can place.
    state = replace(state, capacity=learn(obs, state.capacity, policy, now))
    room = state.capacity.units if state.capacity and state.capacity.holds(now) else None
    d_full, bound = d_rec, ""
    if d_need is not None and d_need.for_prefill > 0:
        state = replace(state, waited_for_prefill=now)
    if policy.prefill_scaled and obs.prefill is not None:
        hold = external or "decode" in missing or obs.decode.rolling_out
        waited = state.waited_for_prefill is not None and now - state.waited_for_prefill <= policy.down_window
        d_rec, bound = _yield_to_prefill((p_rec, d_rec), d_need, obs.decode, policy, room, hold,
                                         state.desired.get("decode"), waited)  # fmt: skip

    # 4: windows and pace; missing data and rollouts never shrink a role.
    d_stable, d_hist = (
        (d_rec, ()) if external else _stabilize(
            "decode", d_rec, d_cur, state, policy, now, "decode" in missing or obs.decode.rolling_out
        )
    )  # fmt: skip
    p_stable, p_hist = p_rec, ()
    if obs.prefill is not None and policy.prefill_scaled:
        hold = "prefill" in missing or obs.prefill.rolling_out
        p_stable, p_hist = _stabilize("prefill", p_rec, p_cur, state, policy, now, hold)

    # 5-6: band, budget and the cluster's room together.
    if policy.prefill_scaled and obs.prefill is not None:
        shares = (claim(p_stable, p_rec, obs.prefill), claim(d_stable, d_rec, obs.decode))
        (p_new, d_new), limit = share(shares, policy, external, room)
        if not external:
            (p_new, d_new), shared = hold_trades((p_new, d_new), (p_cur, d_cur), shares, state, policy, now, room)
            state = replace(state, shared=shared)
        if bound and d_need is not None:
            limit = limit or bound  # the targets themselves did not fit: say so, not "within range"
            pods = f"{d_rec} pod" + ("s" if d_rec != 1 else "")
            d_demand += f"; lanes wait for prefill and the NPUs bind: {pods} at full occupancy"
    else:
        fixed = replace(policy, band=None, bounds=replace(b, prefill_min=p_cur, prefill_max=p_cur))
        (p_new, d_new), limit = share((p_cur, d_stable), fixed, external, room)

    history = dict(state.history)
    if d_hist:
        history["decode"] = d_hist
    if p_hist:
        history["prefill"] = p_hist
    # A scale is a new desired count, not a count still on its way (a drain keeps current above desired for
    # several decisions, each of which would otherwise stamp it again).
    last_scale, desired, scaled = dict(state.last_scale), dict(state.desired), []
    for role, new, cur in (("decode", d_new, d_cur), ("prefill", p_new, p_cur)):
        if role == "prefill" and obs.prefill is None:
            continue
        if new != desired.get(role, cur):
            last_scale[role] = now
            scaled.append(role)
        desired[role] = new
    state = replace(state, history=history, last_scale=last_scale, desired=desired)

    decode = RoleDecision(d_cur, d_rec, d_new, d_demand, d_need.load if d_need else None)
    prefill = None
    if obs.prefill is not None:
        demand = p_need.demand if p_need else "fixed" if not policy.prefill_scaled else "no data"
        prefill = RoleDecision(p_cur, p_rec, p_new, demand, p_need.load if p_need else None)
    wanted = (p_stable, max(d_stable, d_full) if bound else d_stable)  # the targets before a yield
    conditions = _conditions(obs, missing, (d_need, p_need), decode, prefill, (d_stable, p_stable), wanted, limit,
                             policy, state)  # fmt: skip
    return Decision(decode, prefill, _reason(decode, prefill, limit, missing), conditions, state, tuple(scaled))


def _limit_at_bounds(role: str, need: _Need | None, lo: int, hi: int) -> str:
    if need is None:
        return ""
    exact = need.load / need.capacity
    if exact > hi:
        return f"AtMaxReplicas: {role} needs {math.ceil(exact)}, maxReplicas is {hi}"
    if exact < lo and lo > 0 and math.ceil(exact) < lo:
        return f"AtMinReplicas: {role} needs {math.ceil(exact)}, minReplicas is {lo}"
    return ""


def _conditions(obs, missing, needs, decode, prefill, stable, wanted, limit, policy, state) -> tuple[Condition, ...]:
    b = policy.bounds
    if missing:
        active = Condition(
            "ScalingActive", "False", "MetricsUnavailable",
            "; ".join(f"{role}: {why}, holding its count" for role, why in missing.items()),
        )  # fmt: skip
    else:
        active = Condition("ScalingActive", "True", "ValidMetrics", "the pods' metrics were read")
    limits = []
    if limit:
        got = (prefill.desired if prefill else 0, decode.desired)
        wanted = wanted if prefill else (0, wanted[1])
        why = f"{limit}: the pair {got[0]}:{got[1]} (prefill:decode), not the targets {wanted[0]}:{wanted[1]}"
        if limit == "NPUBudget":
            why += (f": they need {policy.cost(*wanted)} NPUs, autoscaling.npuBudget is {policy.npu_budget}"
                    f" ({got[0]}:{got[1]} holds {policy.cost(*got)})")  # fmt: skip
        elif limit == "InsufficientNPUs":
            npus = [policy.npus_decode] + ([policy.npus_prefill] if prefill else [])
            unit = "NPUs" if all(npus) else "pods" if not any(npus) else "NPUs (a pod without one counting one)"
            stuck = stuck_pods(obs, probing=True)
            why += (f": pods stayed Pending as unschedulable ({stuck} now); the pairs stay within the"
                    f" {state.capacity.units} {unit} the cluster placed for {state.capacity.memory:.0f} s")  # fmt: skip
        elif limit == "RatioAdjusted":
            why += ": outside autoscaling.ratio"
        limits.append(why)
    limits += [x for x in (_limit_at_bounds("decode", needs[0], b.decode_min, b.decode_max),) if x]
    if prefill is not None and policy.prefill_scaled:
        limits += [x for x in (_limit_at_bounds("prefill", needs[1], b.prefill_min, b.prefill_max),) if x]
    if limits:
        limited = Condition("ScalingLimited", "True", limits[0].split(":", 1)[0], "; ".join(limits))
    else:
        limited = Condition("ScalingLimited", "False", "DesiredWithinRange", "the desired counts are within range")
    draining = obs.decode.draining + (obs.prefill.draining if obs.prefill else 0)
    rolling = obs.decode.rolling_out or bool(obs.prefill and obs.prefill.rolling_out)
    held = stable[0] != decode.recommended or (prefill is not None and stable[1] != prefill.recommended)
    if draining:
        able = Condition("AbleToScale", "False", "Draining", f"{draining} pods draining before they are removed")
    elif rolling:
        able = Condition("AbleToScale", "False", "RollingOut", "a rollout is in progress; no pod is removed")
    elif held:
        able = Condition("AbleToScale", "True", "StabilizationWindow", "a window or the pace holds the change")
    else:
        able = Condition("AbleToScale", "True", "ReadyForNewScale", "the recommended counts can be applied")
    return active, limited, able


def _reason(decode: RoleDecision, prefill: RoleDecision | None, limit: str, missing: dict[str, str]) -> str:
    parts = []
    for role, r in (("decode", decode), ("prefill", prefill)):
        if r is None:
            continue
        step = f"{r.current}->{r.desired}" if r.desired != r.current else f"{r.current}"
        parts.append(f"{role} {step} ({r.demand}" + (f"; holds: {missing[role]}" if role in missing else "") + ")")
    if prefill is not None:
        parts.append(f"ratio {prefill.desired}:{decode.desired}" + (f" {limit}" if limit else ""))
    return "; ".join(parts)
