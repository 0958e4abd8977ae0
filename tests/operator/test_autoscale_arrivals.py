"""Arrival rates over a window cut at change points, and the decision on them: Poisson clumps do not move a role,
a step does within two intervals, decode's need comes from what arrives (not from requests queued behind lanes
that wait for prefill), and a step that needs both roles moves both in one decision. Arrivals are drawn from a
seeded Poisson process, so each case is one fixed sample path."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from atom_operator.autoscale import arrivals
from atom_operator.autoscale.arrivals import Counts, Window
from atom_operator.autoscale.decision import State, decide
from atom_operator.autoscale.observations import DecodeObservation, Observations, PrefillObservation

from tests.operator.test_autoscale_decision import LANES, SPEED, make_policy, pair

INTERVAL = 5.0
DECODE_STEP = 0.05  # seconds of lane per generated token (the real-node bench's pacing)


def poisson(rng: random.Random, mean: float) -> int:
    n, t = 0, rng.expovariate(1.0)
    while t < mean:
        n, t = n + 1, t + rng.expovariate(1.0)
    return n


def counts(t: float, requests: int, isl: int, osl: int, ended: int | None = None) -> Counts:
    """One interval ending at ``t``: ``requests`` arrivals of isl/osl, and as many ended (steady state)."""
    done = requests if ended is None else ended
    return Counts(t, INTERVAL, requests, requests * isl, requests * osl, done * osl * DECODE_STEP, done * osl)


def observe(c: Counts, *, decode: int = 1, prefill: int = 1, running: float = 0.0, waiting: float = 0.0,
            waiting_for_kv: float = 0.0) -> Observations:  # fmt: skip
    return Observations(
        DecodeObservation(decode, decode, decode, sequences=running + waiting, waiting_for_kv=waiting_for_kv,
                          running=running, queued_for_lane=waiting, counts=c),  # fmt: skip
        PrefillObservation(prefill, prefill, prefill, busy_seconds_per_second=0.0, busy_seconds=5.0,
                           tokens_per_busy_second=SPEED),  # fmt: skip
    )


def test_a_clump_is_not_a_change_and_a_step_is() -> None:
    steady = tuple(Counts(t, INTERVAL, 1, 1000) for t in range(5, 35, 5))  # 0.2 req/s for 30 s
    assert not arrivals.rose(steady, (Counts(35, INTERVAL, 2, 2000),))  # two at once: a clump
    assert not arrivals.rose(steady, (Counts(35, INTERVAL, 4, 4000),))  # 2 % at this rate: not enough
    assert arrivals.rose(steady, (Counts(35, INTERVAL, 7, 7000),))  # 1.4 req/s against 0.2
    assert arrivals.tail(6, 1.0) == pytest.approx(1 - sum(math.exp(-1) / math.factorial(k) for k in range(6)))
    assert arrivals.tail(0, 3.0) == pytest.approx(math.exp(-3))
    assert arrivals.tail(400, 300) == pytest.approx(4.6e-9, rel=0.5)  # the normal side, far out
    busy = tuple(Counts(t, INTERVAL, 8, 8000) for t in range(5, 35, 5))
    assert not arrivals.rose(busy, (Counts(35, INTERVAL, 0, 0), Counts(40, INTERVAL, 1, 1000)))  # a fall waits


def test_steady_poisson_arrivals_do_not_flap_prefill_and_one_interval_rates_do() -> None:
    """200 tok/s of 1000-token prompts needs one worker (350 tok/s at 70 %); read over single intervals, a 5 s
    window with two prompts reads 400 tok/s, which is how the real-node run's prefill went 1 -> 2 -> 1."""
    policy = make_policy(npuBudget=None, ratio=None)
    rng = random.Random(7)
    windowed = single = 0
    state = State()
    for i in range(1, 361):  # 30 minutes of decisions
        c = counts(i * INTERVAL, poisson(rng, 0.2 * INTERVAL), 1000, 20)
        d = decide(observe(c), state, policy, now=i * INTERVAL)
        state = d.state
        windowed += d.prefill.recommended > 1
        one = replace(observe(c).decode, counts=None, arrived_tokens_per_second=c.prompt_tokens / INTERVAL,
                      arrived_requests_per_second=c.requests / INTERVAL)  # fmt: skip
        single += decide(Observations(one, observe(c).prefill), State(), policy, now=0.0).prefill.recommended > 1
    assert single >= 30, single  # the clumps are there to be seen
    assert windowed <= single / 5, (windowed, single)


def test_a_step_reads_within_two_intervals() -> None:
    """0.2 -> 1.5 req/s: a change point within two intervals on every path, and a rate read then that is at least
    twice the old one (one deviation of the count below its mean: the first intervals after a step are chosen
    for being busy)."""
    rng = random.Random(11)
    for seed in range(20):
        rng.seed(seed)
        window = Window()
        for i in range(1, 13):  # a minute at 0.2 req/s
            window, _ = arrivals.add(window, counts(i * INTERVAL, poisson(rng, 1.0), 200, 100), INTERVAL)
        reads = []
        for i in range(13, 15):  # then 1.5 req/s
            window, rates = arrivals.add(window, counts(i * INTERVAL, poisson(rng, 7.5), 200, 100), INTERVAL)
            reads.append((rates.stepping, rates.requests))
        assert reads[-1][0] and max(r for _, r in reads) >= 0.4, (seed, reads)


def test_decode_is_not_raised_for_requests_queued_behind_lanes_that_wait_for_prefill() -> None:
    """Prefill-heavy: 1 req/s of 1000/20 needs 3 workers and one decode pod (a lane a request for 2 s while a
    worker computes its prompt and 1 s of decode: 3 lanes); with one worker Ready the decode pod holds 4 lanes, 3 of
    them waiting for KV, and 25 requests queue behind them: their wait is prefill's shortfall."""
    policy = make_policy(npuBudget=None, ratio=None)
    window = Window()
    for i in range(1, 7):
        window, _ = arrivals.add(window, counts(i * INTERVAL, 5, 1000, 20, ended=2), INTERVAL)
    c = counts(35.0, 5, 1000, 20, ended=2)
    d = decide(observe(c, running=4, waiting=25, waiting_for_kv=3), State(arrivals=window), policy, now=35.0)
    assert pair(d) == (3, 1), d.reason
    assert d.decode.load is not None and d.decode.load < 3.2, d.decode.demand  # one pod's 80 %
    # The same pod with its lanes decoding (none waits for KV) is a decode limit: 4 lanes decoding need 2 pods.
    d = decide(observe(c, running=4, waiting=25), State(arrivals=window), policy, now=35.0)
    assert d.decode.desired == 2, d.reason


def test_a_step_that_needs_both_roles_moves_both_in_one_decision() -> None:
    """From 0.2 req/s of 1000/20 (1+1) to 1 req/s, half 200/200 and half 1000/20: prefill 600 tok/s -> 2, decode
    0.5 x 10 s + 0.5 x 1 s of decode and 1.2 s of prompts computing = 6.7 lanes -> 3. The new requests have not
    decoded a token yet: their max_tokens tell.
    Over 20 sample paths, on most: the first decision that moves anything moves both roles, to at least 2 each,
    within two intervals of the step, and seldom past the optimum. Where the step hides in Poisson noise for a few
    intervals, or one interval's mix is mostly long decodes, decode (whose need follows the arrivals' max_tokens)
    can move a decision before prefill."""
    policy = make_policy(npuBudget=None, ratio=None)
    together = late = over = 0
    for seed in range(20):
        rng = random.Random(seed)
        state, now = State(), 0.0
        for _ in range(12):
            now += INTERVAL
            state = decide(observe(counts(now, poisson(rng, 1.0), 1000, 20)), state, policy, now).state
        after = 0
        while after < 6:
            after += 1
            now += INTERVAL
            n = poisson(rng, 5.0)
            short, long = n // 2, n - n // 2
            c = Counts(now, INTERVAL, n, short * 1000 + long * 200, short * 20 + long * 200, 0.0, 0.0)
            d = decide(observe(c), state, policy, now)
            state = d.state
            if d.scaled:
                break
        together += set(d.scaled) == {"prefill", "decode"} and min(pair(d)) >= 2
        late += after > 2
        over += pair(d) == (3, 3)
    # 200 paths: 72 % move both roles first (to 2+2 on 85, 2+3 on 47, 3+3 on 11: the step's first read is cautious,
    # and the third decode pod follows as lanes fill), 70 % within two intervals.
    assert together >= 14 and late <= 8 and over <= 2, (together, late, over)


def test_long_streams_in_a_steady_load_are_sized_by_the_lanes_they_hold() -> None:
    """6 streams of 800 tokens (40 s) in flight, arriving at 0.15 req/s: 2 decode pods (3.2 lanes each). A 30 s
    window holds 4-5 of those arrivals, and read at face value their rate asks for 3 pods in many decisions; read
    over the regime and two deviations below, it mostly stays under the 6 lanes decoding, which decide (what is
    left: a false change point now and then, after which the window's rate is read for one window)."""
    policy = make_policy(npuBudget=None, ratio=None)
    rng = random.Random(5)
    state = State()
    over = face_value = 0
    for i in range(1, 361):
        c = counts(i * INTERVAL, poisson(rng, 0.15 * INTERVAL), 200, 800)
        d = decide(observe(c, decode=3, running=6), state, policy, now=i * INTERVAL)
        state = d.state
        if i > 24:  # past the first two minutes, while the regime fills
            over += d.decode.recommended > 2
            recent = [x for x in state.arrivals.history if c.end - x.end < arrivals.WINDOW_SECONDS]
            rate = sum(x.max_tokens for x in recent) / sum(x.seconds for x in recent)
            face_value += rate * DECODE_STEP / (LANES * 0.8) > 2
    assert face_value >= 60, face_value  # what the cautious reading is there for
    assert over <= face_value / 5, (over, face_value)


def mixed_counts(rng: random.Random, t: float, rate: float, mix: list[tuple[int, int, int]]) -> Counts:
    """One interval of Poisson arrivals at ``rate``, each request drawn from ``mix``: (weight, isl, osl)."""
    n = poisson(rng, rate * INTERVAL)
    shapes = rng.choices([(isl, osl) for _, isl, osl in mix], weights=[w for w, _, _ in mix], k=n)
    return Counts(t, INTERVAL, n, sum(isl for isl, _ in shapes), sum(osl for _, osl in shapes))


BOTH = [(1, 200, 200), (1, 1000, 20)]  # the bench's D: half of the requests decode 200 tokens
PROMPTS_ONLY = [(1, 1000, 2)]  # its H1: prompts past the workers' speed, two tokens each
STREAMS_JOIN = [(4, 1000, 20), (1, 100, 300)]  # its E phases: one request in five a stream


def steady_cuts(mark: str) -> int:
    """How often half an hour of E's mix (20 seeded paths, 7200 decisions) moves the window's ``mark``."""
    cuts = 0
    for seed in range(20):
        rng, window = random.Random(seed), Window()
        for i in range(1, 361):
            before = getattr(window, mark)
            window, _ = arrivals.add(window, mixed_counts(rng, i * INTERVAL, 1.25, STREAMS_JOIN), INTERVAL)
            cuts += getattr(window, mark) != before
    return cuts


def test_a_new_mix_at_a_like_rate_is_read_within_a_window_and_a_steady_mix_is_not_cut() -> None:
    """D (1 req/s, 110 max_tokens a request) turns into H1 (1.5 req/s of 2 max_tokens): no count rises enough to be
    a change point, and read over the regime, D's streams kept decode's max_tokens rate near D's for two minutes
    (run 13's H1 held two decode pods while prefill queued). On each path the new mix is read within eight
    intervals (a rise's cut may come first and hold some of D; the mix is compared past it); with the mix test
    off it is not. A steady mix of prompts and streams is seldom cut for its mix."""

    def reading_after_switch(seed: int) -> float:
        rng, window = random.Random(seed), Window()
        for i in range(1, 25):  # two minutes of D
            window, _ = arrivals.add(window, mixed_counts(rng, i * INTERVAL, 1.0, BOTH), INTERVAL)
        for i in range(25, 33):  # forty seconds of H1
            window, rates = arrivals.add(window, mixed_counts(rng, i * INTERVAL, 1.5, PROMPTS_ONLY), INTERVAL)
        return rates.max_tokens if rates.stepping else rates.steady_max_tokens or 0.0

    assert all(reading_after_switch(seed) < 10.0 for seed in range(20))  # H1's own rate: 3 max_tokens/s
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arrivals, "MIX_FACTOR", math.inf)
        # D's streams still in the regime on about half of the paths (on the others a rise's cut fell at the switch)
        assert sum(reading_after_switch(seed) > 10.0 for seed in range(20)) >= 8

    assert steady_cuts("mixed_since") <= 30  # of 7200 decisions


PROMPTS = [(1, 1000, 20)]  # the bench's C phases


def test_a_fall_restarts_the_steady_reading_within_a_window_and_a_steady_load_seldom() -> None:
    """E2 (1.25 req/s, one request in five a 300-token stream) falls to C2 (0.5 req/s of 20 max_tokens). No count
    rises, and the new mix needs 30 requests (a minute at 0.5/s), so the regime held E2's streams and decode's
    floor read E2's max_tokens rate (runs 14-20's C2 kept E2's second decode pod to the end). Eight intervals
    into C2, the steady max_tokens rate is C2's on 18 of 20 paths or more (the fall read), and no step; with the
    fall test off, on 2 or fewer. A steady load is seldom cut for a fall."""

    def after_fall(seed: int, intervals: int) -> tuple[Window, arrivals.Rates]:
        rng, window = random.Random(seed), Window()
        for i in range(1, 19):  # 90 s of E2: 95 max_tokens/s
            window, _ = arrivals.add(window, mixed_counts(rng, i * INTERVAL, 1.25, STREAMS_JOIN), INTERVAL)
        for i in range(19, 19 + intervals):  # C2: 10 max_tokens/s
            window, rates = arrivals.add(window, mixed_counts(rng, i * INTERVAL, 0.5, PROMPTS), INTERVAL)
        return window, rates

    def c2_read(seed: int) -> bool:
        window, rates = after_fall(seed, 8)
        assert not rates.stepping, seed  # a fall is no step
        return (rates.steady_max_tokens or 0.0) < 30.0  # C2's, with at most E2's last intervals

    assert sum(c2_read(seed) for seed in range(20)) >= 18
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arrivals, "fell", lambda _older, _newer: False)
        assert sum(c2_read(seed) for seed in range(20)) <= 2  # E2's streams: 55-87 max_tokens/s

    assert steady_cuts("fell_since") <= 30  # of 7200 decisions
    assert arrivals.fell((Counts(5, INTERVAL, 8, 8000), Counts(10, INTERVAL, 8, 8000)), (Counts(15, INTERVAL, 0, 0),))
    assert not arrivals.fell((Counts(5, INTERVAL, 1, 1000),), (Counts(10, INTERVAL, 0, 0),))  # one fewer: a lull


def test_a_request_waiting_beside_a_free_lane_is_not_a_queue_for_a_lane() -> None:
    """Run 23's G3: three 700-token streams (35 s each) in flight on one decode pod of 4 lanes (3.2 at 80 %), the
    next one arriving as one ends. A decision that caught the new one waiting for the pod's next step read the
    regime's arrivals at their mean, as while requests queue for a lane, and asked for a second pod: 1 -> 2 -> 1 in
    a steady phase. Waiting beside a free lane is admission and reads as if nothing waited; waiting at a pod whose
    lanes are all held is a queue and reads at the mean. Over six seeded paths (576 decisions past the first two
    minutes), read as a queue the pod asks for a second one in 188, read as admission in 11."""
    policy = make_policy(npuBudget=None, ratio=None)
    over = {"admitted": 0, "nothing waits": 0, "read as queued": 0}
    for seed in range(6):
        rng = random.Random(seed)
        states = dict.fromkeys(over, State())
        for i in range(1, 121):
            c = counts(i * INTERVAL, poisson(rng, 3 / 35 * INTERVAL), 100, 700)
            waits = observe(c, running=3, waiting=1)  # queued_for_lane=1: as the operator read any waiting before
            seen = {"admitted": replace(waits, decode=replace(waits.decode, queued_for_lane=0.0)),
                    "nothing waits": observe(c, running=3), "read as queued": waits}  # fmt: skip
            for case, obs in seen.items():
                d = decide(obs, states[case], policy, now=i * INTERVAL)
                states[case] = d.state
                over[case] += i > 24 and d.decode.recommended > 1
    assert over["admitted"] == over["nothing waits"], over
    assert over["read as queued"] >= 5 * max(1, over["admitted"]), over
