"""Coupled vs per-role autoscaling on a simulated fleet: the operator's own decision (atom_operator.autoscale) driving
pods whose capacity and cold start are set by design, after a load step that needs both roles to grow.

Not the cluster benchmark (the design's section 8.3 runs real pods); this is section 8.1's simulator: the same
``decide()`` the operator runs, fed the figures an engine exports (lanes held and waiting, lanes waiting for a
remote KV, arrivals at enqueue with their prompt tokens and max_tokens, the decode seconds and max_tokens of the
requests that ended, prefill busy seconds and tokens), once coupled and once with coupling off (each
role from its own pods' figures, as two per-role autoscalers do). Seeds are shared between the two, so each pair
sees the same arrivals. Writes benchmarks/results/autoscaling-simulation.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from atom_operator.api import AtomDeploymentSpec
from atom_operator.autoscale.arrivals import Counts
from atom_operator.autoscale.decision import State, decide
from atom_operator.autoscale.observations import DecodeObservation, Observations, PrefillObservation
from atom_operator.autoscale.policy import policy

OUT = Path(__file__).parent / "results" / "autoscaling-simulation.md"
# Below this heading the file is read by hand (reruns, earlier tables, what they show): a rerun keeps it.
READINGS = "## Readings, kept across reruns"
DT = 0.05
LANES, STEP_S, PREFILL_TOK_S, COLD_S, INTERVAL = 4, 0.05, 500.0, 60.0, 5
WARM = (0.2, 200, 100)  # requests/s, prompt tokens, output tokens
# (name, the load after the step, the pacing arithmetic's optimum as (prefill, decode))
SCENARIOS = [
    # prefill 3 x 600 / (500 x 0.7) -> 6 workers; decode 3 x (1.2 + 5) s / 3.2 -> 6 pods: both must grow
    ("both roles grow", (3.0, 600, 100), (6, 6)),
    # prefill 0.6 x 1000 / 350 -> 2 workers; decode 0.6 x (2 + 1) s / 3.2 -> 1 pod: only prefill must grow
    ("prefill-heavy", (0.6, 1000, 20), (2, 1)),
]
STEP_AT, END = 60.0, 420.0


@dataclass
class Request:
    arrived: float
    isl: int
    osl: int
    first_token: float | None = None
    left: float = 0.0  # decode tokens still to produce


@dataclass
class Pod:
    ready_at: float
    lanes: list[Request | None] = field(default_factory=lambda: [None] * LANES)
    queue: deque = field(default_factory=deque)
    busy_until: float = 0.0  # prefill workers: the prompt they compute
    busy_seconds: float = 0.0
    tokens: float = 0.0
    arrived_tokens: float = 0.0
    arrived_requests: float = 0.0
    arrived_max_tokens: float = 0.0

    def ready(self, now: float) -> bool:
        return now >= self.ready_at

    def held(self) -> int:
        return sum(r is not None for r in self.lanes) + len(self.queue)


def spec() -> AtomDeploymentSpec:
    return AtomDeploymentSpec.model_validate({
        "model": {"source": "builtin:tiny"},
        "decode": {"lanes": LANES, "kvBlocks": LANES + 2, "localPrefill": False},
        "prefill": {"replicas": 1},
        "autoscaling": {"mode": "Operator", "intervalSeconds": INTERVAL,
                        "decode": {"minReplicas": 1, "maxReplicas": 12, "targetOccupancyPercent": 80},
                        "prefill": {"minReplicas": 1, "maxReplicas": 12, "targetUtilizationPercent": 70},
                        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}},
    })  # fmt: skip


def run(coupled: bool, seed: int, step: tuple[float, int, int], optimum: tuple[int, int]) -> dict[str, float]:
    rng = random.Random(seed)
    p = policy(spec(), coupled=coupled)
    decode, prefill = [Pod(0.0)], [Pod(0.0)]
    # Removed pods keep their counters in the sums: the operator reads per-pod deltas, which a removal does not
    # turn negative.
    retired: dict[int, list[Pod]] = {id(decode): [], id(prefill): []}
    kv_queue: deque[tuple[Request, Pod, int]] = deque()  # lanes waiting for a prefill worker
    computing: dict[int, tuple[Request, float]] = {}  # worker index -> (request, done at)
    state, done, arrived = State(), [], []
    ended = [0.0, 0.0]  # decode seconds and max_tokens of the requests that ended (the engine's counters)
    reached = None
    decode_excess = 0.0
    next_arrival, now, next_decision = rng.expovariate(WARM[0]), 0.0, INTERVAL
    snapshot = None
    while now < END:
        rate, isl, osl = WARM if now < STEP_AT else step
        while next_arrival <= now:  # open-loop Poisson arrivals to the least-loaded Ready decode pod
            target = min((d for d in decode if d.ready(now)), key=Pod.held)
            request = Request(next_arrival, isl, osl)
            target.queue.append(request)
            arrived.append(request)
            target.arrived_tokens += isl
            target.arrived_requests += 1
            target.arrived_max_tokens += osl
            next_arrival += rng.expovariate(rate)
        for d in decode:
            for i, lane in enumerate(d.lanes):
                if lane is None and d.queue:
                    r = d.lanes[i] = d.queue.popleft()
                    kv_queue.append((r, d, i))  # the lane is held while its prompt is prefilled remotely
        for w_index, w in enumerate(prefill):
            if not w.ready(now):
                continue
            job = computing.get(w_index)
            if job is not None and job[1] <= now:
                r, _ = computing.pop(w_index)
                r.left, r.first_token = r.osl, now
            if w_index not in computing and kv_queue:
                r, _d, _i = kv_queue.popleft()
                computing[w_index] = (r, now + r.isl / PREFILL_TOK_S)
                w.tokens += r.isl
            if w_index in computing:
                w.busy_seconds += DT
        for d in decode:
            for i, r in enumerate(d.lanes):
                if r is not None and r.first_token is not None:
                    r.left -= DT / STEP_S
                    if r.left <= 0:
                        done.append(r)
                        d.lanes[i] = None
                        ended[0] += now - r.first_token
                        ended[1] += r.osl
        if now >= next_decision:
            ready_d = [d for d in decode if d.ready(now)]
            ready_p = [w for w in prefill if w.ready(now)]
            waiting_kv = sum(1 for _r, d, _i in kv_queue if d.ready(now)) + len(computing)
            counted_d, counted_p = decode + retired[id(decode)], prefill + retired[id(prefill)]
            cur = (sum(d.arrived_tokens for d in counted_d), sum(d.arrived_requests for d in counted_d),
                   sum(w.busy_seconds for w in counted_p), sum(w.tokens for w in counted_p),
                   sum(d.arrived_max_tokens for d in counted_d), ended[0], ended[1])  # fmt: skip
            prev = snapshot or cur
            busy = cur[2] - prev[2]
            obs = Observations(
                DecodeObservation(len(decode), len(ready_d), len(ready_d), sequences=sum(d.held() for d in ready_d),
                                  waiting_for_kv=waiting_kv, arrived_tokens_per_second=(cur[0] - prev[0]) / INTERVAL,
                                  arrived_requests_per_second=(cur[1] - prev[1]) / INTERVAL,
                                  running=sum(x is not None for d in ready_d for x in d.lanes),
                                  queued_for_lane=sum(len(d.queue) for d in ready_d if None not in d.lanes),
                                  counts=Counts(now, INTERVAL, cur[1] - prev[1], cur[0] - prev[0], cur[4] - prev[4],
                                                cur[5] - prev[5], cur[6] - prev[6]) if snapshot else None),
                PrefillObservation(len(prefill), len(ready_p), len(ready_p), busy_seconds_per_second=busy / INTERVAL,
                                   busy_seconds=busy,
                                   tokens_per_busy_second=(cur[3] - prev[3]) / busy if busy else None,
                                   waiting_tokens=sum(r.isl for r, _d, _i in kv_queue)),
            )  # fmt: skip
            snapshot = cur
            d = decide(obs, state, p, now)
            state = d.state
            for pods, want in ((decode, d.decode.desired), (prefill, d.prefill.desired)):
                while len(pods) < want:
                    pods.append(Pod(now + COLD_S))
                # Scale-down after its window: the newest pod that holds nothing (the operator drains it first).
                while len(pods) > want and any(x.held() == 0 for x in pods[1:]):
                    victim = next(x for x in reversed(pods) if x.held() == 0)
                    pods.remove(victim)
                    retired[id(pods)].append(victim)
            next_decision += INTERVAL
        if now >= STEP_AT:
            ready = (sum(w.ready(now) for w in prefill), sum(x.ready(now) for x in decode))
            if reached is None and ready[0] >= optimum[0] and ready[1] >= optimum[1]:
                reached = now - STEP_AT
            decode_excess += max(0, len(decode) - optimum[1]) * DT
        now += DT
    # TTFT of every request that arrived after the step (one still waiting counts its wait so far: no survivors'
    # bias), and those that finished.
    ttft = [(r.first_token if r.first_token is not None else END) - r.arrived for r in arrived if r.arrived >= STEP_AT]
    return {
        "time_to_both": reached if reached is not None else float("inf"),
        "decode_pod_seconds_over": decode_excess,
        "ttft_p90": statistics.quantiles(ttft, n=10)[-1] if len(ttft) >= 10 else float("inf"),
        "finished": sum(r.arrived >= STEP_AT for r in done),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    lines = [
        "# Autoscaling: coupled vs per-role, simulated fleet (`make bench-autoscale-sim`)",
        "",
        f"The operator's `decide()` on a discrete-time fleet (dt {DT} s): decode pods of {LANES} lanes at"
        f" {STEP_S * 1000:.0f} ms a step (targeted at 80 %), prefill workers at {PREFILL_TOK_S:.0f} prompt tokens/s"
        f" one prompt at a time (targeted at 70 %), {COLD_S:.0f} s from a pod's creation to Ready (an NPU start),"
        f" decisions every {INTERVAL} s, each role 1..12, scale-down window 60 s. Open-loop Poisson load: {WARM[0]}"
        f" req/s (ISL {WARM[1]}, OSL {WARM[2]}) until t = {STEP_AT:.0f} s, then the scenario's. Per-role: the same"
        " controller with coupling off (decode on raw lane occupancy, lanes waiting for KV included; prefill on its"
        " served busy time), what two per-role autoscalers do. A simulation of control behaviour, not of NPU numbers;"
        f" medians of {args.seeds} seeds, the same arrivals for both controllers. TTFT counts every request that"
        " arrived after the step (one still waiting at the end counts its wait so far).",
        "",
        "| scenario (optimum prefill:decode) | controller | time until both roles are Ready at target (s) |"
        " decode pod-seconds above target | TTFT p90 after the step (s) | requests finished after the step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for scenario, step, optimum in SCENARIOS:
        rows = {name: [run(coupled, seed, step, optimum) for seed in range(args.seeds)]
                for name, coupled in (("coupled", True), ("per-role", False))}  # fmt: skip
        for name, runs in rows.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            cells = (f"{med['time_to_both']:.0f}", f"{med['decode_pod_seconds_over']:.0f}", f"{med['ttft_p90']:.1f}",
                     f"{med['finished']:.0f}")  # fmt: skip
            lines.append(f"| {scenario} ({optimum[0]}:{optimum[1]}) | {name} | " + " | ".join(cells) + " |")
    lines.append("")
    print("\n".join(lines))
    OUT.write_text("\n".join(lines) + kept_readings(OUT))


def kept_readings(path: Path) -> str:
    """The hand-written readings of the file being rewritten, from their heading on ("" when it has none)."""
    text = path.read_text() if path.exists() else ""
    at = text.find(READINGS)
    return "\n" + text[at:] if at >= 0 else ""


if __name__ == "__main__":
    main()
