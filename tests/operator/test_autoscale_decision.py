"""The autoscaling decision as a function: the pacing arithmetic's optimum, coupling, pending credit, fail-static,
windows and pace; then properties over random inputs (bounds, band, budget, monotone in demand, windows)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from atom_operator.api import AtomDeploymentSpec
from atom_operator.autoscale.arrivals import Counts
from atom_operator.autoscale.decision import Decision, State, decide, utilization_for_slo
from atom_operator.autoscale.loop import direction
from atom_operator.autoscale.observations import DecodeObservation, Observations, PrefillObservation
from atom_operator.autoscale.policy import Policy, policy
from hypothesis import given, settings
from hypothesis import strategies as st

# The design's real-node plan (§8.3): 4 lanes at 80 % (3.2 sequences a pod), prefill 2 ms a token (500 tok/s)
# at 70 % (350 tok/s a worker), each role 1..3, band 1:2..2:1, 4 NPUs.
LANES = 4
SPEED = 500.0


def make_policy(coupled: bool = True, **autoscaling: Any) -> Policy:
    base: dict[str, Any] = {
        "mode": "Operator",
        "intervalSeconds": 5,
        "decode": {"minReplicas": 1, "maxReplicas": 3, "targetOccupancyPercent": 80},
        "prefill": {"minReplicas": 1, "maxReplicas": 3, "targetUtilizationPercent": 70},
        "ratio": {"min": {"prefill": 1, "decode": 2}, "max": {"prefill": 2, "decode": 1}},
        "npuBudget": 4,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}},
    }
    base.update(autoscaling)
    base = {k: v for k, v in base.items() if v is not None}
    spec = AtomDeploymentSpec.model_validate(
        {
            "model": {"source": "builtin:tiny"},
            "decode": {"lanes": LANES, "kvBlocks": 6, "localPrefill": False},
            "prefill": {"replicas": 1},
            "autoscaling": base,
        }
    )
    return policy(spec, coupled=coupled)


def load(
    rate: float, isl: int, osl_seconds: float, *, decode: int = 1, prefill: int = 1, waiting_for_kv: float = 0.0
) -> Observations:
    """Steady state of ``rate`` requests/s of ``isl`` prompt tokens, each decoding for ``osl_seconds``."""
    prefill_seconds = isl / SPEED
    sequences = rate * (prefill_seconds + osl_seconds)  # Little's law: a lane is held for prefill + decode
    busy = rate * prefill_seconds
    return Observations(
        DecodeObservation(
            replicas=decode,
            ready=decode,
            answered=decode,
            sequences=sequences,
            waiting_for_kv=waiting_for_kv or rate * prefill_seconds,
            arrived_tokens_per_second=rate * isl,
            arrived_requests_per_second=rate,
        ),
        PrefillObservation(
            replicas=prefill,
            ready=prefill,
            answered=prefill,
            busy_seconds_per_second=busy,
            busy_seconds=busy * 5,
            tokens_per_busy_second=SPEED,
        ),
    )


def pair(d: Decision) -> tuple[int, int]:
    assert d.prefill is not None
    return d.prefill.desired, d.decode.desired


def condition(d: Decision, type_: str) -> tuple[str, str]:
    c = next(c for c in d.conditions if c.type == type_)
    return c.status, c.reason


# (phase, observations, the pacing arithmetic's optimum as prefill:decode)
PHASES = [
    ("A warm", load(0.2, 200, 5.0), (1, 1)),
    # 1.0 x (0.4 + 5) s = 5.4 sequences / 3.2 -> 2 decode; 200 tok/s / 350 -> 1 prefill.
    ("B decode-heavy", load(1.0, 200, 5.0), (1, 2)),
    # 600 tok/s / 350 -> 2 prefill; decode 0.6 x (2 + 1) = 1.8 sequences, of which 1.2 wait for KV -> 1.
    ("C prefill-heavy", load(0.6, 1000, 1.0), (2, 1)),
]


@pytest.mark.parametrize("phase,obs,expected", PHASES, ids=[p[0] for p in PHASES])
def test_each_phase_reaches_the_pacing_optimum_in_one_decision(phase: str, obs: Observations, expected) -> None:
    d = decide(obs, State(), make_policy(), now=0.0)
    assert pair(d) == expected, d.reason


def test_both_roles_beyond_the_budget_share_it_by_their_need() -> None:
    # D: 1.4 req/s, half B- and half C-shaped: prefill 840 tok/s / 350 -> 3, decode 5.88 / 3.2 -> 2: 5 > 4 NPUs.
    b, c = load(0.7, 200, 5.0), load(0.7, 1000, 1.0)
    obs = Observations(
        replace(
            b.decode,
            sequences=b.decode.sequences + c.decode.sequences,
            waiting_for_kv=b.decode.waiting_for_kv + c.decode.waiting_for_kv,
            arrived_tokens_per_second=840.0,
            arrived_requests_per_second=1.4,
        ),
        b.prefill,
    )
    d = decide(obs, State(), make_policy(), now=0.0)
    assert (d.prefill.recommended, d.decode.recommended) == (3, 2)
    assert pair(d) == (2, 2)  # min(2/3, 2/2) beats min(3/3, 1/2)
    assert condition(d, "ScalingLimited") == ("True", "NPUBudget")
    limited = next(c for c in d.conditions if c.type == "ScalingLimited").message
    assert "the targets 3:2: they need 5 NPUs, autoscaling.npuBudget is 4 (2:2 holds 4)" in limited, limited
    assert not decide(obs, State(), make_policy(npuBudget=None), now=0.0).conditions[1].status == "True"


def test_pods_the_cluster_cannot_place_are_given_up_and_the_room_shared_by_need() -> None:
    """3+3 wanted on a cluster that placed 4 pods (2 prefill Pending as unschedulable): the pair keeps within the 4
    placed, shared as the budget is (2:2, decode giving one up for prefill), and stays there while the memory lasts,
    also after the stuck pods are gone; then it asks again (a probe)."""
    p = make_policy(npuBudget=None, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    want = load(1.5, 600, 5.0, decode=3, prefill=3)  # 900 tok/s -> 3 prefill; 8.1 sequences -> 3 decode
    stuck = replace(want, prefill=replace(want.prefill, ready=1, answered=1, unschedulable=2))
    d = decide(stuck, State(), p, now=100.0)
    assert (d.prefill.recommended, d.decode.recommended) == (3, 3)
    assert pair(d) == (2, 2), d.reason
    assert condition(d, "ScalingLimited") == ("True", "InsufficientNPUs")
    message = next(c for c in d.conditions if c.type == "ScalingLimited").message
    assert "pods stayed Pending as unschedulable (2 now); the pairs stay within the 4 NPUs" in message, message
    assert (d.state.capacity.units, d.state.capacity.until) == (4, 100.0 + 300.0)

    placed = load(1.5, 600, 5.0, decode=2, prefill=2)  # the stuck pods removed, one decode pod given to prefill
    later = decide(placed, d.state, p, now=200.0)
    assert pair(later) == (2, 2) and condition(later, "ScalingLimited") == ("True", "InsufficientNPUs")
    probe = decide(placed, later.state, p, now=401.0)
    assert pair(probe) == (3, 3) and not probe.state.capacity.holds(401.0), probe.reason
    # Without stuck pods, no room is assumed: the same load on 3+3 asks for 3+3.
    assert pair(decide(want, State(), p, now=100.0)) == (3, 3)
    # A pod still terminating holds its NPU, which the stuck one may be waiting for: the room counts it.
    leaving = replace(stuck, decode=replace(stuck.decode, replicas=2, terminating=1))
    assert decide(leaving, State(), p, now=100.0).state.capacity.units == 4


def test_a_probe_that_finds_no_more_room_waits_longer_before_the_next() -> None:
    """Runs 13-15's C3b and D ended on a probe: a Pending pod asked for every five minutes on a node that never grew.
    Each probe that finds the same room doubles how long the room bounds the pairs (300, 600, 1200, 1200 s); one
    that finds more room starts again at 300 s."""
    p = make_policy(npuBudget=None, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    want = load(1.5, 600, 5.0, decode=3, prefill=3)
    stuck = replace(want, prefill=replace(want.prefill, ready=1, answered=1, unschedulable=2))  # 4 placed
    placed = load(1.5, 600, 5.0, decode=2, prefill=2)
    state, now, probes = State(), 100.0, []
    for _ in range(5):
        d = decide(stuck, state, p, now)  # the stuck pods seen: the room is read again
        state = decide(placed, d.state, p, now + 5.0).state  # given up; the pairs stay within the room
        memory = state.capacity.memory
        assert pair(decide(placed, state, p, now + memory - 1.0)) == (2, 2)
        probe = decide(placed, state, p, now + memory + 1.0)
        assert pair(probe) == (3, 3), probe.reason  # lapsed: it asks again
        probes.append(memory)
        now, state = now + memory + 70.0, probe.state  # its pods stay Pending for a minute before they are stuck
    assert probes == [300.0, 600.0, 1200.0, 1200.0, 1200.0]
    message = next(c for c in decide(stuck, state, p, now).conditions if c.type == "ScalingLimited").message
    assert "the pairs stay within the 4 NPUs the cluster placed for 1200 s" in message, message

    # A probe that finds more room (a node added: 5 placed, one still stuck) starts the memory again.
    grown = replace(want, prefill=replace(want.prefill, ready=2, answered=2, unschedulable=1))
    d = decide(grown, state, p, now)
    assert (d.state.capacity.units, d.state.capacity.memory) == (5, 300.0)


def test_a_probe_is_answered_by_the_scheduler_first_no_and_a_first_reading_waits_the_minute() -> None:
    """Runs 17-20's C3b ended on a probe: its Pending pod counted toward decode's target for the minute before it
    was taken for stuck. A probe asks whether room was freed, which the scheduler's first attempt answers: one
    interval later the pair is back within the room, and the memory doubles. Outside a probe, pods the scheduler
    has only just turned away are no reading yet (a cluster autoscaler may be adding a node): the minute holds."""
    p = make_policy(npuBudget=None, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    want = load(1.5, 600, 5.0, decode=3, prefill=3)
    placed = load(1.5, 600, 5.0, decode=2, prefill=2)
    turned_away = replace(want, prefill=replace(want.prefill, ready=1, answered=1, newly_unschedulable=2))
    first = decide(turned_away, State(), p, now=100.0)
    assert first.state.capacity is None and pair(first) == (3, 3), first.reason  # not yet: the minute holds

    stuck = replace(want, prefill=replace(want.prefill, ready=1, answered=1, unschedulable=2))
    state = decide(placed, decide(stuck, State(), p, now=100.0).state, p, now=105.0).state
    probe = decide(placed, state, p, now=401.0)
    assert pair(probe) == (3, 3), probe.reason  # lapsed: the targets again
    answered = decide(turned_away, probe.state, p, now=406.0)  # the new pods turned away at once
    assert pair(answered) == (2, 2), answered.reason
    assert (answered.state.capacity.units, answered.state.capacity.memory) == (4, 600.0)
    assert condition(answered, "ScalingLimited") == ("True", "InsufficientNPUs")
    message = next(c for c in answered.conditions if c.type == "ScalingLimited").message
    assert "pods stayed Pending as unschedulable (2 now)" in message, message

    # A reading lapsed as long ago as it held (300 s) is forgotten: pods turned away then wait the minute again.
    forgotten = decide(turned_away, probe.state, p, now=100.0 + 300.0 + 300.0)
    assert forgotten.state.capacity is None and pair(forgotten) == (3, 3), forgotten.reason


def test_a_node_joining_lapses_the_room_at_once() -> None:
    """The room is read while the nodes advertise 4 NPUs; a node with 4 more joins (a cluster autoscaler's, for
    the pods that stayed Pending): the next decision asks for the targets, not five or twenty minutes later."""
    p = make_policy(npuBudget=None, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    want = load(1.5, 600, 5.0, decode=3, prefill=3)
    stuck = replace(want, prefill=replace(want.prefill, ready=1, answered=1, unschedulable=2), npus=4)
    placed = replace(load(1.5, 600, 5.0, decode=2, prefill=2), npus=4)
    state = decide(placed, decide(stuck, State(), p, now=100.0).state, p, now=105.0).state
    assert state.capacity.npus == 4
    assert pair(decide(placed, state, p, now=200.0)) == (2, 2)
    joined = decide(replace(placed, npus=8), state, p, now=200.0)
    assert pair(joined) == (3, 3), joined.reason
    # Its new pods are placed: nothing is stuck, and no room bounds the pairs.
    settled = decide(replace(want, npus=8), joined.state, p, now=205.0)
    assert pair(settled) == (3, 3) and not settled.state.capacity.holds(205.0)
    # Nodes whose count is not known (the informer's) leave the room to its memory.
    assert pair(decide(replace(placed, npus=None), state, p, now=200.0)) == (2, 2)


def test_a_step_that_needs_both_roles_moves_both_in_one_decision() -> None:
    # From one of each, a load needing 3 prefill and 3 decode: one decision, not decode now and prefill later.
    obs = load(1.5, 600, 5.0)
    d = decide(obs, State(), make_policy(npuBudget=None, behavior={"scaleUp": {"maxPodsPerInterval": 2}}), now=0.0)
    assert pair(d) == (3, 3), d.reason
    assert d.prefill.current == 1 and d.decode.current == 1


def test_lanes_waiting_for_a_remote_kv_are_prefill_demand_not_decode() -> None:
    # A short prefill tier: decode lanes fill with requests waiting for their KV (4 of 4.6 sequences).
    obs = load(0.6, 1000, 1.0, waiting_for_kv=4.0)
    obs = replace(obs, decode=replace(obs.decode, sequences=4.6))
    coupled = decide(obs, State(), make_policy(), now=0.0)
    assert coupled.decode.desired == 1 and coupled.prefill.desired == 2
    # The same controller per role (what two independent autoscalers do) adds decode pods for prefill's shortfall.
    independent = decide(obs, State(), make_policy(coupled=False), now=0.0)
    assert independent.decode.recommended == 2


def steady(prefill: int, decode: int, *, stuck: int = 0) -> Observations:
    """C3 of the real-node plan in steady state, as decode's pods report it: 1 request/s of 1000 prompt tokens and
    20 max_tokens at 0.05 lane seconds each; 4 lanes held, 2 of them waiting for a worker's KV, one request queued
    for a lane at the pod that holds them; ``stuck`` of the prefill pods Pending as unschedulable."""
    counts = Counts(end=0.0, seconds=5.0, requests=5.0, prompt_tokens=5000.0, max_tokens=100.0, decode_seconds=5.0,
                    decoded_max_tokens=100.0)  # fmt: skip
    placed = prefill - stuck
    return Observations(
        DecodeObservation(replicas=decode, ready=decode, answered=decode, sequences=5.0, waiting_for_kv=2.0,
                          running=4.0, queued_for_lane=1.0, counts=counts),  # fmt: skip
        PrefillObservation(replicas=prefill, ready=placed, answered=placed, unschedulable=stuck,
                           busy_seconds_per_second=2.0, busy_seconds=10.0, tokens_per_busy_second=SPEED),  # fmt: skip
    )


def decide_steadily(obs: Observations, p: Policy, intervals: int = 8) -> Decision:
    state, d = State(), None
    for i in range(intervals):
        now = i * p.interval_seconds
        obs = replace(obs, decode=replace(obs.decode, counts=replace(obs.decode.counts, end=now)))
        d = decide(obs, state, p, now)
        state = d.state
    assert d is not None
    return d


def test_when_the_npus_bind_decode_lanes_waiting_for_prefill_yield_to_prefill() -> None:
    """The real node's C3: prefill needs 3 workers (1000 tok/s at 350), decode 2 pods for 4 lanes of which 2 only
    wait for prefill. Where 3+2 fits, both get their targets; where the cluster placed 4 (a third worker stays
    Pending), the NPU goes to the bottleneck: 3+1, not 2+2, once decode's down window has passed (a yield is a
    scale-down like any other)."""
    p = make_policy(npuBudget=None, ratio=None)  # a 60 s down window
    free = decide_steadily(steady(prefill=3, decode=2), p, intervals=16)
    assert pair(free) == (3, 2), free.reason
    assert condition(free, "ScalingLimited") == ("False", "DesiredWithinRange")

    held = decide_steadily(steady(prefill=3, decode=2, stuck=1), p, intervals=8)  # 35 s: inside the window
    assert (held.prefill.recommended, held.decode.recommended) == (3, 1)
    assert pair(held) == (2, 2), held.reason
    assert condition(held, "AbleToScale") == ("True", "StabilizationWindow")

    bound = decide_steadily(steady(prefill=3, decode=2, stuck=1), p, intervals=16)  # 75 s
    assert pair(bound) == (3, 1), bound.reason
    assert condition(bound, "ScalingLimited") == ("True", "InsufficientNPUs")
    message = next(c for c in bound.conditions if c.type == "ScalingLimited").message
    assert "the pair 3:1 (prefill:decode), not the targets 3:2" in message, message
    assert "lanes wait for prefill and the NPUs bind: 1 pod at full occupancy" in bound.decode.demand, bound.reason

    # The same lanes decoding for themselves (no KV awaited) hold decode's pods: the room is shared by need, 2:2.
    own = steady(prefill=3, decode=2, stuck=1)
    own = replace(own, decode=replace(own.decode, waiting_for_kv=0.0))
    assert pair(decide_steadily(own, p, intervals=16)) == (2, 2)
    # A budget binds the same way.
    budget = decide_steadily(steady(prefill=3, decode=2), make_policy(npuBudget=4, ratio=None), intervals=16)
    assert pair(budget) == (3, 1) and condition(budget, "ScalingLimited") == ("True", "NPUBudget"), budget.reason


def test_a_ready_pod_is_not_given_up_for_a_pending_one_the_other_role_keeps_only_by_its_window() -> None:
    """Run 15's C3: 3+2 wanted, decode's second pod stuck Pending on 4 NPUs. The yield had left decode 1, but its
    down window still held 2, and sharing the room for that 2 removed prefill's Ready third worker (2+2). The window
    keeps pods that serve; the stuck one is given up instead, and prefill keeps its workers: 3+1 at once."""
    p = make_policy(npuBudget=None, ratio=None)  # a 60 s down window
    state, d = State(), None
    for i in range(16):
        obs = steady(prefill=3, decode=2)
        if i >= 12:  # the room becomes known 15 s before the end: decode's second pod did not fit
            obs = replace(obs, decode=replace(obs.decode, ready=1, answered=1, unschedulable=1))
        obs = replace(obs, decode=replace(obs.decode, counts=replace(obs.decode.counts, end=i * 5.0)))
        d = decide(obs, state, p, now=i * 5.0)
        state = d.state
        if i == 11:
            assert pair(d) == (3, 2), d.reason
    assert d is not None and (d.prefill.recommended, d.decode.recommended) == (3, 1)
    assert pair(d) == (3, 1), d.reason
    assert condition(d, "ScalingLimited") == ("True", "InsufficientNPUs")

    # A Ready decode pod the window keeps is kept (a scale-down waits for its window): the room is shared, 2:2.
    ready = steady(prefill=3, decode=2, stuck=1)
    assert pair(decide_steadily(ready, p, intervals=8)) == (2, 2)


def test_lanes_waiting_for_prefill_that_come_and_go_move_no_pod() -> None:
    """Run 9's E1: with the NPUs bound, the lanes waiting for a worker's KV read 0 in one interval and 1-2 in the
    next. The yield followed each reading at once (2+2, 3+1, 2+2, ... every 25 s, a worker drained and started
    each time). As a recommendation inside the down window, decode keeps its pods until the yield has held a
    whole window, and once it has, a reading with no lane waiting does not undo it (run 10's E2: 3+1, 2+2 at
    once): the pair moves once."""
    p = make_policy(npuBudget=None, ratio=None)
    waiting = steady(prefill=3, decode=2, stuck=1)
    decoding = replace(waiting, decode=replace(waiting.decode, waiting_for_kv=0.0))
    state, pairs = State(started=-1000.0), []
    for i in range(24):  # two minutes
        obs = decoding if i % 3 == 0 else waiting  # no lane waits in one interval of three
        obs = replace(obs, decode=replace(obs.decode, counts=replace(obs.decode.counts, end=i * 5.0)))
        d = decide(obs, state, p, now=i * 5.0)
        state, pairs = d.state, [*pairs, pair(d)]
    changes = [b for a, b in zip(pairs, pairs[1:], strict=False) if a != b]
    assert pairs[0] == (2, 2) and changes == [(3, 1)], pairs
    # Inside the window nothing moves; the control, lanes that never waited, never moves at all.
    assert set(pairs[:12]) == {(2, 2)}, pairs
    state, pairs = State(started=-1000.0), []
    for i in range(24):
        obs = replace(decoding, decode=replace(decoding.decode, counts=replace(decoding.decode.counts, end=i * 5.0)))
        d = decide(obs, state, p, now=i * 5.0)
        state, pairs = d.state, [*pairs, pair(d)]
    assert set(pairs) == {(2, 2)}, pairs


def test_a_yield_never_leaves_decode_fewer_lanes_than_its_requests_hold() -> None:
    """Runs 9 and 10's E phases: decode held 4.2-4.6 lanes (streams decoding, prompts being computed), some
    waiting for prefill, with 4 NPUs for targets 3+3. Yielding the lanes that wait took decode to one pod of 4
    lanes and made it the bottleneck; at full occupancy it keeps 2, and the room is shared by need, 2+2. At 4.0
    lanes (C3) one pod holds them all and the NPU goes to prefill, 3+1."""
    p = make_policy(npuBudget=None, ratio=None)
    e2 = steady(prefill=3, decode=2, stuck=1)
    e2 = replace(e2, decode=replace(e2.decode, running=4.6, sequences=5.6))
    assert pair(decide_steadily(e2, p, intervals=16)) == (2, 2)
    assert pair(decide_steadily(steady(prefill=3, decode=2, stuck=1), p, intervals=16)) == (3, 1)


def test_a_yield_happens_where_the_lanes_held_swing_around_one_pod() -> None:
    """Run 14's C3b: 8 lanes held on two decode pods, 6 or 8 of them waiting for a worker in turn, so the lanes
    decode's requests hold read 4.2 and 3.1 by turns. At full occupancy exactly, the count read 2 and 1 by turns
    and the down window (the largest of its readings) kept 2: 2+2 for the whole phase against 3+1."""
    p = make_policy(npuBudget=None, ratio=None)
    base = steady(prefill=3, decode=2, stuck=1)
    state, d = State(), None
    for i in range(24):  # two minutes
        running, waiting = (8.0, 5.8) if i % 2 else (8.0, 8.0)  # 4.2 lanes held, then 2.0 (3.0 arriving)
        obs = replace(base, decode=replace(base.decode, running=running, sequences=running + 2.0,
                                           waiting_for_kv=waiting, counts=replace(base.decode.counts, end=i * 5.0)))
        d = decide(obs, state, p, now=i * 5.0)
        state = d.state
    assert d is not None and pair(d) == (3, 1), d.reason


def test_a_queue_the_workers_clear_within_the_window_adds_no_worker() -> None:
    """The real node's C1 (0.2 requests/s of 1000 tokens, 200 tok/s at 350 a worker): one prompt queued behind
    another is 2 s of a worker's time, cleared within the 5 s window by the 300 tok/s it has to spare. A backlog
    the spare cannot clear is prefill's shortfall, and pods still starting count as spare."""
    light = load(0.2, 1000, 1.0)
    light = replace(light, prefill=replace(light.prefill, waiting_tokens=1000.0))
    d = decide(light, State(), make_policy(), now=0.0)
    assert d.prefill.desired == 1, d.prefill.demand
    assert "1000 tok queued (0 beyond what the workers clear in 5 s)" in d.prefill.demand, d.prefill.demand

    # 300 tok/s on one worker spares 200 tok/s, 1000 tokens a window: of 5000 queued, 4000 remain -> 1100 tok/s.
    behind = load(0.3, 1000, 1.0)
    behind = replace(behind, prefill=replace(behind.prefill, waiting_tokens=5000.0))
    d = decide(behind, State(), make_policy(npuBudget=None, ratio=None), now=0.0)
    assert d.prefill.load == pytest.approx(300.0 + 4000.0 / 5) and d.prefill.desired == 3, d.prefill.demand
    # The same queue with a second worker starting: 3500 tokens cleared a window, 1500 left -> 600 tok/s, 2 workers.
    starting = replace(behind, prefill=replace(behind.prefill, replicas=2))
    d = decide(starting, State(), make_policy(npuBudget=None, ratio=None), now=0.0)
    assert d.prefill.load == pytest.approx(300.0 + 1500.0 / 5) and d.prefill.recommended == 2, d.prefill.demand


def test_after_a_step_the_whole_queue_counts() -> None:
    # Steady 0.2 requests/s of 1000 tokens, then an interval with 7: a change point, read cautiously.
    p, state, d = make_policy(npuBudget=None, ratio=None), State(), None
    for i, requests in enumerate([1, 1, 1, 1, 1, 1, 7]):
        counts = Counts(end=i * 5.0, seconds=5.0, requests=requests, prompt_tokens=1000.0 * requests,
                        max_tokens=20.0 * requests, decode_seconds=1.0, decoded_max_tokens=20.0)  # fmt: skip
        obs = load(0.2, 1000, 1.0, prefill=3)  # spare that would clear the queue in a steady load
        obs = replace(obs, decode=replace(obs.decode, counts=counts, running=1.0),
                      prefill=replace(obs.prefill, waiting_tokens=1000.0 if i == 6 else 0.0))  # fmt: skip
        d = decide(obs, state, p, now=i * 5.0)
        state = d.state
    assert d is not None and "beyond" not in d.prefill.demand, d.prefill.demand
    arrived = float(d.prefill.demand.split(" tok/s")[0])
    assert d.prefill.load == pytest.approx(arrived + 1000.0 / 5, abs=0.5), d.prefill.demand


def test_pods_not_yet_ready_count_toward_the_target() -> None:
    # Three decode pods desired, one Ready (two still loading): the same demand asks for nothing more.
    obs = load(1.5, 200, 5.0, decode=3)
    obs = replace(obs, decode=replace(obs.decode, ready=1, answered=1))
    p = make_policy(npuBudget=None)
    d = decide(obs, State(), p, now=0.0)
    assert d.decode.desired == 3
    for t in (5.0, 10.0, 15.0):  # again and again while they start: no +1 cascade
        d = decide(obs, d.state, p, now=t)
        assert d.decode.desired == 3


def test_missing_metrics_hold_the_count() -> None:
    p = make_policy(npuBudget=None, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    quiet = load(0.05, 200, 1.0, decode=3, prefill=2)
    silent = replace(quiet, decode=replace(quiet.decode, answered=0), prefill=replace(quiet.prefill, answered=0))
    d = decide(silent, State(), p, now=0.0)
    assert pair(d) == (2, 3)
    assert condition(d, "ScalingActive") == ("False", "MetricsUnavailable")
    # One of three decode pods answered: its low load cannot shrink the role ...
    partial = replace(quiet, decode=replace(quiet.decode, answered=1))
    assert decide(partial, State(), p, now=0.0).decode.desired == 3
    # ... but what it alone shows can grow it.
    busy = replace(partial, decode=replace(partial.decode, sequences=20.0))
    assert decide(busy, State(), p, now=0.0).decode.desired == 3  # at max already
    p5 = make_policy(npuBudget=None, decode={"minReplicas": 1, "maxReplicas": 8})
    assert decide(busy, State(), p5, now=0.0).decode.desired == 5
    # With every pod answering, the same quiet load shrinks it.
    assert decide(quiet, State(), p, now=0.0).decode.desired == 2


def test_scale_down_waits_for_the_window_and_the_start() -> None:
    p = make_policy(npuBudget=None)
    low = load(0.2, 200, 5.0, decode=3, prefill=2)
    state = State()
    for t in range(0, 60, 5):
        d = decide(low, state, p, now=float(t))
        assert (d.decode.desired, d.prefill.desired) == (3, 2), t  # no history yet: one window first
        state = d.state
    d = decide(low, state, p, now=60.0)
    assert (d.decode.desired, d.prefill.desired) == (2, 1)  # one pod per role per decision
    low2 = load(0.2, 200, 5.0, decode=2, prefill=1)
    assert decide(low2, d.state, p, now=65.0).decode.desired == 1


def test_a_scale_is_stamped_once_not_at_every_decision_of_its_drain() -> None:
    # Decode 3 -> 2 at 60 s; the drain keeps the Deployment at 3 for the next decisions: no new scale, no new
    # lastScaleTime (status.autoscaling would otherwise be rewritten, and ScaledDown posted, every interval).
    p = make_policy(npuBudget=None, decode={"minReplicas": 1, "maxReplicas": 3}, prefill=None, ratio=None)
    low = load(0.2, 200, 5.0, decode=3)
    low = replace(low, prefill=None)
    state = replace(State(), started=0.0)
    d = decide(low, state, p, now=60.0)
    assert d.decode.desired == 2 and d.scaled == ("decode",) and d.state.last_scale == {"decode": 60.0}
    assert direction("decode", d.decode, d) == "down"  # atom_autoscaler_decisions_total counts it once
    for t in (65.0, 70.0):
        d = decide(low, d.state, p, now=t)
        assert d.decode.desired == 2 and d.decode.current == 3  # still draining
        assert d.scaled == () and d.state.last_scale == {"decode": 60.0}
        assert direction("decode", d.decode, d) == "none"
    d = decide(replace(low, decode=replace(low.decode, replicas=2, ready=2, answered=2)), d.state, p, now=75.0)
    assert d.decode.desired == 1 and d.scaled == ("decode",) and d.state.last_scale == {"decode": 75.0}


def test_a_spike_inside_the_window_keeps_the_count() -> None:
    p = make_policy(npuBudget=None, decode={"minReplicas": 1, "maxReplicas": 8}, ratio=None)
    state = State(started=-1000.0)
    d = decide(load(2.0, 200, 5.0, decode=4), state, p, now=0.0)
    assert d.decode.desired == 4
    for t in (5.0, 30.0, 55.0):  # quiet, but the spike is inside the 60 s window
        d = decide(load(0.2, 200, 5.0, decode=4), d.state, p, now=t)
        assert d.decode.desired == 4
    d = decide(load(0.2, 200, 5.0, decode=4), d.state, p, now=61.0)
    assert d.decode.desired == 3


def test_tolerance_keeps_a_count_near_its_need() -> None:
    p = make_policy(npuBudget=None, ratio=None, decode={"minReplicas": 1, "maxReplicas": 8})
    # 2 pods hold 6.4 sequences at target; 6.9 is within 10 %.
    obs = load(1.0, 200, 5.0, decode=2)
    assert decide(replace(obs, decode=replace(obs.decode, sequences=6.9 + 0.4)), State(), p, 0.0).decode.desired == 2
    assert decide(replace(obs, decode=replace(obs.decode, sequences=7.4 + 0.4)), State(), p, 0.0).decode.desired == 3


def test_a_need_at_the_edge_of_a_drains_target_keeps_the_victim_cordoned() -> None:
    # Decode 2 -> 1 is draining (the Deployment still counts the victim). 3.3 sequences is one pod's 3.2 and 3 %:
    # within the tolerance of the count decode is heading to, so the victim stays cordoned; measured against the
    # two pods still there it read as "2" and un-cordoned it, to cordon it again a window later (run 8's C3).
    p = make_policy(npuBudget=None, decode={"minReplicas": 1, "maxReplicas": 3}, prefill=None, ratio=None)
    history = {"decode": tuple((float(t), 1) for t in range(40, 100, 5))}
    state = State(started=0.0, history=history, last_scale={"decode": 95.0}, desired={"decode": 1})
    draining = DecodeObservation(replicas=2, ready=2, answered=2, draining=1, sequences=3.3)
    assert decide(Observations(draining), state, p, now=100.0).decode.desired == 1
    # The control: load that does return (3.8, 19 % over one pod) un-cordons at once.
    returned = replace(draining, sequences=3.8)
    assert decide(Observations(returned), state, p, now=100.0).decode.desired == 2
    # Without a drain under way the tolerance is the current count's, as before: 3.3 on two pods asks for two.
    assert decide(Observations(replace(draining, draining=0)), replace(state, desired={"decode": 2}), p,
                  now=100.0).decode.desired == 2  # fmt: skip


def test_pace_limits_pods_per_decision() -> None:
    p = make_policy(npuBudget=None, ratio=None, decode={"minReplicas": 1, "maxReplicas": 20})
    d = decide(load(5.0, 200, 5.0), State(), p, now=0.0)
    assert d.decode.recommended == 8 and d.decode.desired == 3  # 25 sequences / 3.2 -> 8; +2 a decision


def test_external_mode_takes_decode_from_the_spec_and_fits_prefill_into_the_band() -> None:
    p = make_policy(mode="External", npuBudget=None, decode={"minReplicas": 1, "maxReplicas": 6},
                    prefill={"minReplicas": 1, "maxReplicas": 6})  # fmt: skip
    obs = replace(load(0.05, 200, 1.0, decode=1), external_decode=6)
    d = decide(obs, State(), p, now=0.0)
    assert pair(d) == (3, 6)  # prefill needs 1, the band's 1:2 needs 3 beside 6 decode pods
    assert condition(d, "ScalingLimited") == ("True", "RatioAdjusted")


def test_slo_utilization_follows_the_queueing_bound() -> None:
    # A 0.4 s prompt and a 2 s TTFT: 1.6 s of queue allowed, rho <= 3.2 / 3.6.
    assert utilization_for_slo(2.0, 0.4) == pytest.approx(3.2 / 3.6)
    assert utilization_for_slo(0.3, 0.4) == 0.05  # the prompt alone exceeds the SLO: the floor
    p = make_policy(prefill={"minReplicas": 1, "maxReplicas": 3}, slo={"ttftMilliseconds": 600}, npuBudget=None)
    # 1 s prompts cannot meet 0.6 s: the floor utilization sizes prefill at its max.
    assert decide(load(0.6, 500, 1.0), State(), p, now=0.0).prefill.desired == 3


def test_the_speed_is_measured_without_a_hint_and_held_without_busy_time() -> None:
    p = make_policy(npuBudget=None)
    d = decide(load(0.6, 1000, 1.0), State(), p, now=0.0)
    assert d.state.tokens_per_busy_second == SPEED
    idle = load(0.0, 1000, 1.0)
    d2 = decide(idle, d.state, p, now=5.0)
    assert d2.state.tokens_per_busy_second == SPEED


# ---------------------------------------------------------------------------------------------------- properties

DECODE = st.builds(
    DecodeObservation,
    replicas=st.integers(1, 8),
    ready=st.integers(0, 8),
    answered=st.integers(0, 8),
    rolling_out=st.booleans(),
    sequences=st.floats(0, 200),
    waiting_for_kv=st.floats(0, 20),
    arrived_tokens_per_second=st.one_of(st.none(), st.floats(0, 20000)),
    arrived_requests_per_second=st.one_of(st.none(), st.floats(0.01, 50)),
    unschedulable=st.integers(0, 2),  # the cluster's room: a second budget, which bounds, band and budget outrank
)
PREFILL = st.builds(
    PrefillObservation,
    replicas=st.integers(0, 8),
    ready=st.integers(0, 8),
    answered=st.integers(0, 8),
    unschedulable=st.integers(0, 2),
    busy_seconds_per_second=st.one_of(st.none(), st.floats(0, 16)),
    busy_seconds=st.floats(0, 60),
    tokens_per_busy_second=st.one_of(st.none(), st.floats(1, 5000)),
    waiting_tokens=st.floats(0, 50000),
)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    dmin, dmax = sorted((draw(st.integers(1, 8)), draw(st.integers(1, 8))))
    pmin, pmax = sorted((draw(st.integers(1, 8)), draw(st.integers(1, 8))))
    band = draw(
        st.one_of(
            st.none(),
            st.tuples(*[st.integers(1, 6)] * 4).filter(lambda t: t[0] * t[3] <= t[2] * t[1]),
        )
    )
    auto: dict[str, Any] = {
        "mode": draw(st.sampled_from(["Operator", "External"])),
        "decode": {"minReplicas": dmin, "maxReplicas": dmax},
        "prefill": {"minReplicas": pmin, "maxReplicas": pmax},
        "ratio": None if band is None else {"min": dict(prefill=band[0], decode=band[1]),
                                            "max": dict(prefill=band[2], decode=band[3])},  # fmt: skip
        "npuBudget": draw(st.one_of(st.none(), st.integers(2, 20))),
        "behavior": {
            "tolerancePercent": draw(st.integers(0, 30)),
            "scaleUp": {"maxPodsPerInterval": draw(st.integers(1, 4))},
            "scaleDown": {"stabilizationWindowSeconds": draw(st.sampled_from([0, 30, 300]))},
        },
    }
    try:
        return make_policy(coupled=draw(st.booleans()), **auto)
    except ValueError:  # a refused spec (band out of reach, budget too small) is not a policy
        from hypothesis import reject

        reject()


def _observations(draw_decode: DecodeObservation, draw_prefill: PrefillObservation, external: int) -> Observations:
    d = replace(draw_decode, ready=min(draw_decode.ready, draw_decode.replicas))
    d = replace(d, answered=min(d.answered, d.ready))
    p = replace(draw_prefill, ready=min(draw_prefill.ready, draw_prefill.replicas))
    p = replace(p, answered=min(p.answered, p.ready))
    return Observations(d, p, external)


@settings(max_examples=400, deadline=None)
@given(policies(), DECODE, PREFILL, st.integers(0, 10), st.floats(0, 1000))
def test_every_decision_is_inside_the_bounds_the_band_and_the_budget(p, dobs, pobs, external, now) -> None:
    obs = _observations(dobs, pobs, external)
    d = decide(obs, State(), p, now)
    prefill, decode = pair(d)
    assert p.bounds.contains(prefill, decode)
    assert p.band is None or p.band.contains(prefill, decode)
    assert p.npu_budget is None or p.cost(prefill, decode) <= p.npu_budget
    if p.mode == "External" and decode > max(p.bounds.decode_min, external):  # the HPA's count is a ceiling ...
        ceiling = max(p.bounds.decode_min, min(external, p.bounds.decode_max))
        assert not any(  # ... unless no pair at or below it fits
            (p.band is None or p.band.contains(q, e)) for e in range(p.bounds.decode_min, ceiling + 1)
            for q in range(p.bounds.prefill_min, p.bounds.prefill_max + 1)
            if p.npu_budget is None or p.cost(q, e) <= p.npu_budget
        )  # fmt: skip
    assert decide(obs, State(), p, now) == d  # same inputs, same output


@settings(max_examples=300, deadline=None)
@given(policies(), DECODE, PREFILL, st.floats(1, 4))
def test_more_demand_never_asks_for_fewer_pods(p, dobs, pobs, factor) -> None:
    p = replace(p, npu_budget=None, mode="Operator")  # a binding budget moves NPUs between the roles by design
    dobs, pobs = replace(dobs, unschedulable=0), replace(pobs, unschedulable=0)  # and so does the cluster's room
    obs = _observations(dobs, pobs, 0)
    more = replace(
        obs,
        decode=replace(
            obs.decode,
            sequences=obs.decode.sequences * factor,
            waiting_for_kv=obs.decode.waiting_for_kv,
            arrived_tokens_per_second=None
            if obs.decode.arrived_tokens_per_second is None
            else obs.decode.arrived_tokens_per_second * factor,
        ),
        prefill=replace(
            obs.prefill,
            busy_seconds_per_second=None
            if obs.prefill.busy_seconds_per_second is None
            else obs.prefill.busy_seconds_per_second * factor,
            waiting_tokens=obs.prefill.waiting_tokens * factor,
        ),
    )
    base, grown = decide(obs, State(), p, 0.0), decide(more, State(), p, 0.0)
    assert grown.decode.desired >= base.decode.desired and grown.prefill.desired >= base.prefill.desired


@settings(max_examples=200, deadline=None)
@given(policies(), st.lists(st.floats(0, 60), min_size=2, max_size=30))
def test_no_role_shrinks_below_a_recommendation_of_its_down_window(p, demand) -> None:
    p = replace(p, mode="Operator", npu_budget=None, band=None)
    state, decode, recs = State(), p.bounds.decode_min, []
    for i, sequences in enumerate(demand):
        now = i * p.interval_seconds
        obs = load(0.0, 200, 1.0, decode=decode)
        obs = replace(obs, decode=replace(obs.decode, sequences=sequences, waiting_for_kv=0.0))
        d = decide(obs, state, p, now)
        recs.append((now, d.decode.recommended))
        if d.decode.desired < decode:
            window = [r for t, r in recs if now - t <= p.down_window]
            assert d.decode.desired >= max(window) or d.decode.desired == decode - p.down_pods
            assert now - 0.0 >= p.down_window
            assert decode - d.decode.desired <= p.down_pods
        if d.decode.desired > decode:
            assert d.decode.desired - decode <= p.up_pods
        state, decode = d.state, d.decode.desired


def test_decode_capacity_is_lanes_times_occupancy() -> None:
    p = make_policy(npuBudget=None, ratio=None, decode={"minReplicas": 1, "maxReplicas": 64,
                                                        "targetOccupancyPercent": 50},
                    behavior={"tolerancePercent": 0, "scaleUp": {"maxPodsPerInterval": 64}})  # fmt: skip
    obs = load(0.0, 200, 1.0)
    for sequences in (1.0, 2.0, 2.1, 9.0, 40.0):
        o = replace(obs, decode=replace(obs.decode, sequences=sequences, waiting_for_kv=0.0))
        assert decide(o, State(), p, 0.0).decode.desired == max(1, math.ceil(sequences / (LANES * 0.5)))


@pytest.mark.parametrize(
    ("decode", "prefill"),
    [
        ({"backend": "atom", "npusPerReplica": 2}, {"backend": "rngd", "npusPerReplica": 1}),
        ({"backend": "atom", "npusPerReplica": 1}, {"backend": "cpu", "npusPerReplica": 0}),
        ({"backend": "cpu", "npusPerReplica": 0}, {"backend": "atom", "npusPerReplica": 4}),
    ],
)
def test_the_budget_counts_the_npus_each_pod_requests(decode: dict, prefill: dict) -> None:
    # One count for the pod template's NPU limit and the budget (npu.npus_requested): a pair's cost is what its
    # pods request, whatever the backends.
    from atom_operator.children import Defaults, build_children
    from atom_operator.children.meta import Owner

    spec = AtomDeploymentSpec.model_validate({
        "model": {"source": "builtin:tiny"},
        "decode": {**decode, "replicas": 1, "lanes": LANES, "kvBlocks": 6, "localPrefill": False},
        "prefill": {**prefill, "replicas": 1},
        "autoscaling": {"mode": "Operator", "decode": {"minReplicas": 1, "maxReplicas": 3},
                        "prefill": {"minReplicas": 1, "maxReplicas": 3}, "npuBudget": 99},
    })  # fmt: skip
    defaults = Defaults()
    requested = {}
    for child in build_children(Owner("llm", "ns", "u1", spec), defaults).desired:
        if child["kind"] == "Deployment" and child["metadata"]["name"] in ("llm-decode", "llm-prefill"):
            role = child["metadata"]["name"].removeprefix("llm-")
            backend = getattr(spec, role).backend
            limits = child["spec"]["template"]["spec"]["containers"][0]["resources"].get("limits") or {}
            resource = defaults.npu.resource(backend)
            requested[role] = int(limits.get(resource, 0)) if resource else 0
    p = policy(spec)
    assert (p.npus_decode, p.npus_prefill) == (requested["decode"], requested["prefill"])
    assert p.cost(2, 3) == 2 * requested["prefill"] + 3 * requested["decode"]


def test_a_queue_the_spare_clears_within_the_arrivals_window_waits_for_the_step_with_decode() -> None:
    """The real node's C1 -> D (runs 16 and 17): 0.2 requests/s of 1000-token prompts on one worker, then D's first
    interval, 4 requests half 200/200 and half 1000/20, three prompts queued. That count is no change point yet
    (p about 0.02), so decode holds; read against one interval's clearing, the queue grew prefill alone, and decode
    followed a decision later. The queued prompts arrived within the arrivals' window, whose rate already holds
    them, and the worker's spare clears them within it: prefill waits for the change point, and both roles move
    in its decision."""
    p = make_policy(npuBudget=None, ratio=None)

    def interval(i: int, requests: float, prompt: float, max_tokens: float, running: float, queued: float):
        counts = Counts(end=i * 5.0, seconds=5.0, requests=requests, prompt_tokens=prompt, max_tokens=max_tokens,
                        decode_seconds=0.05 * max_tokens, decoded_max_tokens=max_tokens)  # fmt: skip
        decode = DecodeObservation(replicas=1, ready=1, answered=1, sequences=running, running=running,
                                   waiting_for_kv=min(running, queued / 1000 + 1), counts=counts)  # fmt: skip
        prefill = PrefillObservation(replicas=1, ready=1, answered=1, busy_seconds_per_second=0.4, busy_seconds=2.0,
                                     tokens_per_busy_second=SPEED, waiting_tokens=queued)  # fmt: skip
        return Observations(decode, prefill)

    steady = [interval(i, 1.0, 1000.0, 20.0, 1.0, 0.0) for i in range(18)]  # C1: 0.2/s for a minute and a half
    first = interval(18, 4.0, 2400.0, 440.0, 3.0, 3000.0)
    second = interval(19, 6.0, 3600.0, 660.0, 5.0, 4000.0)
    state, pairs, demands, d = State(started=-1000.0), [], [], None
    for i, obs in enumerate([*steady, first, second]):
        d = decide(obs, state, p, now=i * 5.0)
        state, pairs, demands = d.state, [*pairs, pair(d)], [*demands, d.prefill.demand]
    assert d is not None and set(pairs[:-1]) == {(1, 1)}, (pairs, demands[-2])
    assert "3000 tok queued (0 beyond what the workers clear in 30 s)" in demands[-2], demands[-2]
    assert pairs[-1][0] >= 2 and pairs[-1][1] >= 2, d.reason


def test_a_role_held_above_a_lowered_max_does_not_take_the_other_below_its_target() -> None:
    """Run 18's C2: the spec lowered prefill's maxReplicas to 1 while prefill ran 2 and its down window still held
    2 (the share then read 2:2 as the targets). Prefill's share could not pass 1 of its 2, so every decode count
    covered the same worst share (a half) and the cheapest, decode 1, won: decode's busy pod was cordoned and
    un-cordoned a decision later, when the window had let prefill go. maxReplicas applies at once, as in HPA, and
    where one role's share is capped, the other still gets its target."""
    p = make_policy(npuBudget=None, ratio=None, prefill={"minReplicas": 1, "maxReplicas": 1})
    obs = load(0.6, 1000, 8.0, decode=2, prefill=2)  # decode 0.6 x 8 s = 4.8 sequences (1.2 more wait) -> 2
    state = State(started=-1000.0, history={"prefill": ((-5.0, 2),), "decode": ((-5.0, 2),)})
    d = decide(obs, state, p, now=0.0)
    assert pair(d) == (1, 2), d.reason
