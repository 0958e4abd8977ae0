"""A simulated fleet of decode pods and prefill workers whose service is set by design, for `make
bench-autoscale-sim`: open-loop arrivals (:mod:`benchmarks.autoscale_shapes`), a controller that sets each role's
count, and what the requests got.

The service model is the engine's: a request holds a decode lane from admission (first come, first served, over
the pods' lanes pooled as the Service spreads them) until its last token; while it holds the lane its prompt waits
for and is computed by one prefill worker (one prompt at a time, FIFO over the workers); then it decodes one token
per step. A pod counts from its creation (its node's room) and serves from Ready, ``start_s`` later; a pod the
node cannot hold stays Pending until another leaves. A scale-down cordons: a decode pod leaves once the other pods'
lanes hold what is in flight, a prefill worker once its prompt is done. Time moves in steps of ``DT``; within a step
prefill starts and ends are exact, lanes are handed out at the step's start.

Controllers (:class:`Controller`) are asked for a pair every ``interval``; they read the fleet through
:meth:`Fleet.reading`. The operator's own ``decide()`` is driven through :func:`observations`, its inputs as the
scraper builds them.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
from atom_operator.autoscale.arrivals import Counts
from atom_operator.autoscale.observations import DecodeObservation, Observations, PrefillObservation

from benchmarks.autoscale_shapes import SEGMENT_S, Arrivals, Shape

DT = 0.5
LANES = 4
STEP_S = 0.05  # a decode step: one token per lane
PREFILL_TOK_S = 500.0  # a prefill worker's prompt tokens per second
TTFT_SLACK_S = 5.0  # a request is within the TTFT bound if its first token comes within its own prefill + this
UNSCHEDULABLE_S = 60.0  # as the operator's loop: Pending this long is a full node, not a node on its way


@dataclass
class Pod:
    created: float
    placed: float | None = None  # when the node took it (None: Pending)
    start_s: float = 0.0
    draining: bool = False
    free_at: float = 0.0  # prefill: when its current prompt is done

    def ready(self, now: float) -> bool:
        return self.placed is not None and now >= self.placed + self.start_s


@dataclass
class Reading:
    """One interval of the fleet as an engine's counters and gauges show it (sums over the pods)."""

    now: float
    seconds: float
    answered: bool  # False during a metrics outage
    decode: list[Pod]
    prefill: list[Pod]
    held: int  # lanes held
    queued: int  # requests waiting for a lane
    waiting_for_kv: int  # lanes held whose prompt is not computed yet
    arrived: tuple[float, float, float]  # requests, prompt tokens, max_tokens within the interval
    ended: tuple[float, float]  # decode seconds and max_tokens of the requests that ended within it
    busy_seconds: float
    waiting_tokens: float
    room: int | None


@dataclass
class Outcome:
    ttft_ok: float  # share of requests within the TTFT bound
    pod_seconds: float
    desired: list[tuple[float, int, int]]  # (time, prefill, decode) after each decision
    ready: np.ndarray  # per segment: (prefill, decode) ready and serving


class Fleet:
    def __init__(self, shape: Shape, arr: Arrivals, start_s: float | None = None, initial: tuple[int, int] = (1, 1)):
        self.shape, self.arr = shape, arr
        self.start_s = shape.start_s if start_s is None else start_s
        self.room = shape.room
        self.pods: dict[str, list[Pod]] = {"prefill": [], "decode": []}
        n = len(arr.time)
        self.first = np.full(n, math.inf)  # first token
        self.start = np.full(n, math.inf)  # prefill start
        self.admit = np.full(n, math.inf)
        self.arrived = self.admitted = self.scheduled = self.ended = 0
        self.heap: list[tuple[float, int]] = []  # (lane release time, request) of the prompts computed
        self.ended_seconds = self.ended_osl = 0.0
        self.pod_seconds = 0.0
        self.now = 0.0
        for role, count in zip(("prefill", "decode"), initial, strict=True):
            for _ in range(count):
                self.pods[role].append(Pod(-1e9, start_s=0.0))
        self._place()

    # ---- actuation -------------------------------------------------------------------------------------------
    def set(self, prefill: int, decode: int) -> None:
        for role, want in (("prefill", prefill), ("decode", decode)):
            pods = self.pods[role]
            live = [p for p in pods if not p.draining]
            for p in pods:  # a rise un-cordons first: no start
                if len(live) < want and p.draining:
                    p.draining = False
                    live.append(p)
            while len(live) < want:
                pod = Pod(self.now, start_s=self.start_s)
                pods.append(pod)
                live.append(pod)
            # Down: pods not Ready first (newest first), then cordon the Ready ones.
            surplus = len(live) - want
            for p in sorted(live, key=lambda p: (p.ready(self.now), -p.created)):
                if surplus <= 0:
                    break
                if not p.ready(self.now):
                    pods.remove(p)
                else:
                    p.draining = True
                surplus -= 1
        self._place()

    def _place(self) -> None:
        placed = sum(p.placed is not None for role in self.pods.values() for p in role)
        pending = sorted((p for role in self.pods.values() for p in role if p.placed is None), key=lambda p: p.created)
        for p in pending:
            if self.room is not None and placed >= self.room:
                break
            p.placed = self.now
            placed += 1

    # ---- one step ---------------------------------------------------------------------------------------------
    def step(self) -> None:
        t, end = self.now, self.now + DT
        while self.heap and self.heap[0][0] <= t:  # lanes whose last token came
            _, i = heapq.heappop(self.heap)
            self.ended += 1
            self.ended_seconds += self.arr.osl[i] * STEP_S
            self.ended_osl += self.arr.osl[i]
        decode = self.pods["decode"]
        serving = sum(p.ready(t) and not p.draining for p in decode)
        held = self.admitted - self.ended
        for p in [p for p in decode if p.draining and p.ready(t)]:  # a drained pod leaves
            if held <= serving * LANES:
                decode.remove(p)
        prefill = self.pods["prefill"]
        for p in [p for p in prefill if p.draining and p.free_at <= t]:
            prefill.remove(p)
        self._place()
        self.arrived = int(np.searchsorted(self.arr.time, end))
        admit = min(max(0, serving * LANES - held), self.arrived - self.admitted)
        if admit:
            idx = slice(self.admitted, self.admitted + admit)
            self.admit[idx] = np.maximum(self.arr.time[idx], t)
            self.admitted += admit
        workers = [p for p in prefill if p.ready(t) and not p.draining]
        while self.scheduled < self.admitted and workers:
            w = min(workers, key=lambda p: p.free_at)
            i = self.scheduled
            begin = max(w.free_at, self.admit[i], t)
            if begin >= end:
                break
            w.free_at = begin + self.arr.isl[i] / PREFILL_TOK_S
            self.start[i], self.first[i] = begin, w.free_at
            heapq.heappush(self.heap, (w.free_at + self.arr.osl[i] * STEP_S, i))
            self.scheduled += 1
        self.pod_seconds += DT * sum(p.placed is not None for role in self.pods.values() for p in role)
        self.now = end

    # ---- what the pods' metrics show --------------------------------------------------------------------------
    def reading(self, since: float, marks: dict[str, float]) -> Reading:
        t = self.now
        lo = int(np.searchsorted(self.arr.time, since, side="right"))
        hi = int(np.searchsorted(self.arr.time, t, side="right"))
        recent = slice(max(0, self.scheduled - 2000), self.scheduled)
        starts, firsts = self.start[recent], self.first[recent]
        busy = float(np.clip(np.minimum(firsts, t) - np.maximum(starts, since), 0, None).sum())
        late = firsts > t
        not_started = starts > t
        ended = (self.ended_seconds - marks.get("seconds", 0.0), self.ended_osl - marks.get("osl", 0.0))
        marks["seconds"], marks["osl"] = self.ended_seconds, self.ended_osl
        return Reading(
            now=t,
            seconds=t - since,
            answered=not any(a <= t < b for a, b in self.shape.outages),
            decode=self.pods["decode"],
            prefill=self.pods["prefill"],
            held=self.admitted - self.ended,
            queued=self.arrived - self.admitted,
            waiting_for_kv=(self.admitted - self.scheduled) + int(late.sum()),
            arrived=(float(hi - lo), float(self.arr.isl[lo:hi].sum()), float(self.arr.osl[lo:hi].sum())),
            ended=ended,
            busy_seconds=busy,
            waiting_tokens=float(
                self.arr.isl[self.scheduled : self.admitted].sum() + self.arr.isl[recent][not_started].sum()
            ),  # fmt: skip
            room=self.room,
        )

    def ttft_ok(self) -> float:
        """Share of the requests that arrived before the last minute whose first token came within the bound."""
        counted = self.arr.time < self.shape.duration - 60
        bound = self.arr.time + self.arr.isl / PREFILL_TOK_S + TTFT_SLACK_S
        ok = (self.first <= bound) & counted
        return float(ok.sum() / max(1, counted.sum()))


def _role(pods: list[Pod], now: float, answered: bool) -> dict[str, int]:
    pending = [p for p in pods if p.placed is None]
    serving = sum(p.ready(now) and not p.draining for p in pods)
    return {
        "replicas": len(pods),
        "ready": serving,
        "answered": serving if answered else 0,
        "draining": sum(p.draining for p in pods),
        "unschedulable": sum(now - p.created >= UNSCHEDULABLE_S for p in pending),
        "newly_unschedulable": sum(now - p.created < UNSCHEDULABLE_S for p in pending),
    }


def observations(r: Reading, paired: bool) -> Observations:
    """What the operator's scraper builds from the pods' /metrics: ``paired`` when the previous interval was read
    too (counters need two scrapes)."""
    d, p = _role(r.decode, r.now, r.answered), _role(r.prefill, r.now, r.answered)
    counts = None
    if r.answered and paired and d["answered"]:
        counts = Counts(r.now, r.seconds, *r.arrived, *r.ended)
    serving_lanes = d["ready"] * LANES
    dobs = DecodeObservation(
        **d,
        sequences=float(r.held + r.queued) if r.answered else 0.0,
        waiting_for_kv=float(r.waiting_for_kv) if r.answered else 0.0,
        arrived_tokens_per_second=r.arrived[1] / r.seconds if counts else None,
        arrived_requests_per_second=r.arrived[0] / r.seconds if counts else None,
        running=float(r.held) if r.answered else None,
        queued_for_lane=float(r.queued) if r.answered and r.held >= serving_lanes else 0.0,
        counts=counts,
    )
    speed = PREFILL_TOK_S if r.busy_seconds > 0 else None
    pobs = PrefillObservation(
        **p,
        busy_seconds_per_second=r.busy_seconds / r.seconds if r.answered and paired else None,
        busy_seconds=r.busy_seconds if r.answered and paired else 0.0,
        tokens_per_busy_second=speed if r.answered and paired else None,
        waiting_tokens=r.waiting_tokens if r.answered else 0.0,
    )
    return Observations(dobs, pobs, npus=r.room)


class Controller:
    """Asked for (prefill, decode) every ``interval`` seconds; None keeps the counts."""

    interval: float = 15.0

    def decide(self, reading: Reading, paired: bool) -> tuple[int, int] | None:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass
class Schedule(Controller):
    """Counts known ahead, per segment (the oracle, the static fleet)."""

    pairs: np.ndarray  # (segments, 2)
    interval: float = SEGMENT_S

    def decide(self, reading: Reading, paired: bool) -> tuple[int, int]:
        k = min(int(reading.now / SEGMENT_S), len(self.pairs) - 1)
        return int(self.pairs[k][0]), int(self.pairs[k][1])


def run(shape: Shape, arr: Arrivals, controller: Controller, start_s: float | None = None,
        initial: tuple[int, int] = (1, 1)) -> Outcome:  # fmt: skip
    fleet = Fleet(shape, arr, start_s, initial)
    marks: dict[str, float] = {}
    since, paired = 0.0, False
    next_decision = 0.0 if isinstance(controller, Schedule) else controller.interval
    desired = []
    ready = np.zeros((int(shape.duration / SEGMENT_S), 2))
    next_segment = 0
    steps = int(round(shape.duration / DT))
    for _ in range(steps):
        if fleet.now >= next_decision - 1e-9:
            reading = fleet.reading(since, marks)
            pair = controller.decide(reading, paired)
            paired = reading.answered
            since = fleet.now
            if pair is not None:
                fleet.set(*pair)
                desired.append((fleet.now, *pair))
            next_decision += controller.interval
        if fleet.now >= next_segment * SEGMENT_S - 1e-9 and next_segment < len(ready):
            t = fleet.now
            ready[next_segment] = (sum(p.ready(t) and not p.draining for p in fleet.pods["prefill"]),
                                   sum(p.ready(t) and not p.draining for p in fleet.pods["decode"]))  # fmt: skip
            next_segment += 1
        fleet.step()
    return Outcome(fleet.ttft_ok(), fleet.pod_seconds, desired, ready)
