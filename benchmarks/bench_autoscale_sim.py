"""`make bench-autoscale-sim`: the operator's autoscaling decision on a seeded family of load shapes, beside a
per-role HPA, a static fleet at each role's peak and an oracle, on the same arrivals.

The shapes (:mod:`benchmarks.autoscale_shapes`) are drawn per family from seeds: diurnal ramps, on/off bursts,
sawtooth ramps, long-prompt spikes, chat->RAG mix shifts, heavy-tailed lengths, metrics outages, 60-300 s starts,
a full node and a node saturated beyond its pods. The fleet (:mod:`benchmarks.autoscale_fleet_sim`) serves them
with the engine's service model. Controllers:

- **operator**: ``decide()`` itself, fed what the scraper builds from the pods' metrics, at the API's defaults;
- **HPA**: one HorizontalPodAutoscaler per role (its replica calculation, tolerance 0.1, a 300 s scale-down
  window, its default policies, a 15 s sync), decode on lane occupancy (target 80 %), prefill on busy time (70 %);
- **static**: each role at its peak need for the whole shape (within the node);
- **oracle**: each segment's need from the shape's own means, its pods Ready when needed (within the node).

Per family: the share of requests whose first token came within their own prefill + 5 s, pod-seconds against the
oracle's, reversals (a change opposite to the role's previous change) per role and shape, and the time from a step
of the load to both roles Ready at the step's need. A simulation of control behaviour, not of NPU numbers.

    python benchmarks/bench_autoscale_sim.py [--shapes N] [--seed S] [--jobs J] [--out PATH]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: benchmarks.* from the repository root
    sys.path.insert(0, str(REPO))

from atom_operator.api import AtomDeploymentSpec  # noqa: E402
from atom_operator.autoscale.decision import State, decide  # noqa: E402
from atom_operator.autoscale.policy import Policy, policy  # noqa: E402

from benchmarks.autoscale_fleet_sim import (  # noqa: E402
    LANES,
    PREFILL_TOK_S,
    STEP_S,
    TTFT_SLACK_S,
    Controller,
    Outcome,
    Reading,
    Schedule,
    observations,
    run,
)  # fmt: skip
from benchmarks.autoscale_shapes import FAMILIES, SEGMENT_S, Shape, arrivals, shapes  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "autoscaling-simulation.md"
READINGS = "## Readings, kept across reruns"
MAX_REPLICAS = 12
OCCUPANCY, UTILIZATION = 0.8, 0.7  # the targets every controller sizes for
HPA_SYNC_S, HPA_DOWN_WINDOW_S, HPA_TOLERANCE = 15.0, 300.0, 0.1
CONTROLLERS = ("operator", "HPA", "static", "oracle")


def spec() -> AtomDeploymentSpec:
    return AtomDeploymentSpec.model_validate({
        "model": {"source": "builtin:tiny"},
        "decode": {"lanes": LANES, "kvBlocks": LANES + 2, "localPrefill": False},
        "prefill": {"replicas": 1},
        "autoscaling": {"mode": "Operator",
                        "decode": {"minReplicas": 1, "maxReplicas": MAX_REPLICAS,
                                   "targetOccupancyPercent": round(OCCUPANCY * 100)},
                        "prefill": {"minReplicas": 1, "maxReplicas": MAX_REPLICAS,
                                    "targetUtilizationPercent": round(UTILIZATION * 100)}},
    })  # fmt: skip


class Operator(Controller):
    def __init__(self, rules: Policy) -> None:
        self.rules, self.state = rules, State()
        self.interval = rules.interval_seconds

    def decide(self, reading: Reading, paired: bool) -> tuple[int, int]:
        d = decide(observations(reading, paired), self.state, self.rules, reading.now)
        self.state = d.state
        assert d.prefill is not None
        return d.prefill.desired, d.decode.desired


def hpa_replicas(total: float, target: float, current: int, ready: int) -> int:
    """HPA's replica calculation for a Pods metric (``total`` summed over the Ready pods): the ratio of the
    average to the target times the Ready pods, within the tolerance the current count; pods not yet Ready count
    as using nothing when the ratio asks for more, and a ratio they turn around keeps the count."""
    if ready == 0:
        return current
    ratio = total / (ready * target)
    if ready == current or ratio < 1:
        return current if abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(ratio * ready)
    ratio = total / (current * target)
    return current if ratio <= 1 + HPA_TOLERANCE else math.ceil(ratio * current)


class Hpa(Controller):
    interval = HPA_SYNC_S

    def __init__(self) -> None:
        self.spec = {"prefill": 1, "decode": 1}
        self.history: dict[str, list[tuple[float, int]]] = {"prefill": [], "decode": []}

    def decide(self, r: Reading, paired: bool) -> tuple[int, int] | None:
        if not (r.answered and paired):
            return None  # no metric: an HPA keeps the count
        metrics = {
            "prefill": (r.busy_seconds / r.seconds, UTILIZATION),
            "decode": ((r.held + r.queued) / LANES, OCCUPANCY),
        }
        for role, pods in (("prefill", r.prefill), ("decode", r.decode)):
            current = self.spec[role]
            ready = sum(p.ready(r.now) and not p.draining for p in pods)
            rec = hpa_replicas(*metrics[role], current, ready)
            history = [(t, x) for t, x in self.history[role] if r.now - t < HPA_DOWN_WINDOW_S] + [(r.now, rec)]
            self.history[role] = history
            stable = current
            if stable < rec:
                stable = rec
            down = max(x for _, x in history)
            if stable > down:
                stable = down
            stable = min(stable, max(2 * current, current + 4))  # default scale-up policy per 15 s
            self.spec[role] = min(MAX_REPLICAS, max(1, stable))
        return self.spec["prefill"], self.spec["decode"]


def water_fill(p: int, d: int, room: int | None) -> tuple[int, int]:
    """The pair within the room covering the larger share of both needs, then of the other's."""
    if room is None or p + d <= room:
        return p, d
    best = max(range(1, room), key=lambda q: sorted((min(1, q / p), min(1, (room - q) / d))))
    return best, room - best


def needs(shape: Shape) -> np.ndarray:
    """Each segment's need from the service model at the shape's means: prefill work over a worker's speed at the
    utilization target; decode lanes held (prefill plus decode time) over a pod's lanes at the occupancy target."""
    isl, osl = shape.means()
    p = np.ceil(shape.rate * isl / PREFILL_TOK_S / UTILIZATION - 1e-9)
    d = np.ceil(shape.rate * (isl / PREFILL_TOK_S + osl * STEP_S) / (LANES * OCCUPANCY) - 1e-9)
    pairs = np.clip(np.stack([p, d], axis=1), 1, MAX_REPLICAS).astype(int)
    return np.array([water_fill(int(a), int(b), shape.room) for a, b in pairs])


def reversals(series: list[int]) -> int:
    changes = [b - a for a, b in zip(series, series[1:], strict=False) if b != a]
    return sum((x > 0) != (y > 0) for x, y in zip(changes, changes[1:], strict=False))


def steps(shape: Shape, oracle: np.ndarray) -> list[int]:
    """Segments where the load jumps (rate or mix by a fifth or more) and the oracle's need rises."""
    out = []
    for k in range(1, len(oracle)):
        jump = abs(shape.rate[k] - shape.rate[k - 1]) > 0.2 * shape.rate[k - 1] or abs(
            shape.share[k] - shape.share[k - 1]) > 0.2  # fmt: skip
        if jump and (oracle[k] > oracle[k - 1]).any() and (oracle[k] >= oracle[k - 1]).all():
            out.append(k)
    return out


def to_target(ready: np.ndarray, oracle: np.ndarray, k: int) -> float | None:
    """Seconds from step ``k`` until both roles are Ready at its need (None: not within the shape)."""
    met = np.nonzero((ready[k:] >= oracle[k]).all(axis=1))[0]
    return float(met[0] * SEGMENT_S) if len(met) else None


@dataclass
class Row:
    family: str
    ttft: dict[str, float]
    pod_seconds: dict[str, float]
    reversals: dict[str, tuple[int, int]]  # (prefill, decode)
    to_target: dict[str, list[float | None]]
    start_s: float


def one(shape: Shape) -> Row:
    arr = arrivals(shape)
    oracle = needs(shape)
    static = np.tile(water_fill(*oracle.max(axis=0), shape.room), (len(oracle), 1))
    outcomes: dict[str, Outcome] = {
        "operator": run(shape, arr, Operator(policy(spec()))),
        "HPA": run(shape, arr, Hpa()),
        "static": run(shape, arr, Schedule(static), initial=tuple(static[0])),
        "oracle": run(shape, arr, Schedule(oracle), start_s=0.0, initial=tuple(oracle[0])),
    }
    row = Row(shape.family, {}, {}, {}, {}, shape.start_s)
    for name, o in outcomes.items():
        row.ttft[name] = o.ttft_ok
        row.pod_seconds[name] = o.pod_seconds
        if name == "oracle":
            row.reversals[name] = (reversals(list(oracle[:, 0])), reversals(list(oracle[:, 1])))
        else:
            row.reversals[name] = (reversals([1] + [p for _, p, _ in o.desired]),
                                   reversals([1] + [d for _, _, d in o.desired]))  # fmt: skip
        row.to_target[name] = [to_target(o.ready, oracle, k) for k in steps(shape, oracle)]
    return row


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(rows: list[Row]) -> tuple[list[str], dict[str, dict[str, bool]]]:
    by: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by[r.family].append(r)
    lines = [
        "| family | shapes | in TTFT bound: operator / HPA / static / oracle | pod-seconds vs oracle: operator /"
        " HPA / static | reversals per role and shape, mean (max): operator P, D / HPA P, D / oracle P, D |"
        " step to both at target, median / max (steps, unmet): operator; HPA | goals: SLO, reversals, cost, vs HPA |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    goals: dict[str, dict[str, bool]] = {}
    for family in dict.fromkeys(f(np.random.default_rng(0), 0).family for f in FAMILIES):
        rs = by.get(family)
        if not rs:
            continue
        share = {c: statistics.mean(r.ttft[c] for r in rs) for c in CONTROLLERS}
        cost = {c: sum(r.pod_seconds[c] for r in rs) / sum(r.pod_seconds["oracle"] for r in rs) for c in CONTROLLERS}

        def rev(c: str, i: int, rs: list[Row] = rs) -> str:
            xs = [r.reversals[c][i] for r in rs]
            return f"{statistics.mean(xs):.1f} ({max(xs)})"

        def step(c: str, rs: list[Row] = rs) -> str:
            xs = [x for r in rs for x in r.to_target[c]]
            met = [x for x in xs if x is not None]
            worst = f"{max(met):.0f}" if met else "-"
            return f"{_median(met):.0f} / {worst} s ({len(xs)}, {len(xs) - len(met)})" if xs else "-"

        ok = {
            "SLO": share["operator"] >= min(share["static"], share["oracle"]) - 0.10,
            "reversals": all(max(r.reversals["operator"]) <= max(3, *r.reversals["oracle"]) for r in rs),
            "cost": cost["operator"] <= 1.5,
            "vs HPA": not (share["operator"] < share["HPA"] and cost["operator"] > cost["HPA"]),
        }
        goals[family] = ok
        cells = [
            family, str(len(rs)),
            " / ".join(f"{100 * share[c]:.0f} %" for c in CONTROLLERS),
            " / ".join(f"{cost[c]:.2f}" for c in ("operator", "HPA", "static")),
            f"{rev('operator', 0)}, {rev('operator', 1)} / {rev('HPA', 0)}, {rev('HPA', 1)} / "
            f"{rev('oracle', 0)}, {rev('oracle', 1)}",
            f"{step('operator')}; {step('HPA')}",
            ", ".join(("met" if v else "**not met**") for v in ok.values()),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines, goals


def slow_start_line(rows: list[Row]) -> str:
    within, total = 0, 0
    for r in rows:
        if r.family != "60-300 s starts":
            continue
        for x in r.to_target["operator"]:
            total += 1
            within += x is not None and x <= r.start_s + 60
    return f"Slow starts: {within} of {total} steps met by the operator within the start delay + 60 s."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=200, help="shapes to draw (the families in turn)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT, help="the report (a run with --shapes < 200 prints only)")
    args = parser.parse_args()
    began = time.monotonic()
    drawn = shapes(args.shapes, args.seed)
    if args.jobs > 1:
        with multiprocessing.Pool(args.jobs) as pool:
            rows = pool.map(one, drawn, chunksize=1)
    else:
        rows = [one(s) for s in drawn]
    lines, _ = table(rows)
    elapsed = time.monotonic() - began
    rules = policy(spec())
    head = [
        "# Autoscaling on a family of load shapes, simulated (`make bench-autoscale-sim`)",
        "",
        f"{len(drawn)} shapes (seed {args.seed}), {len(FAMILIES)} families in turn, {drawn[0].duration:.0f} s each;"
        f" decode pods of {LANES} lanes at {STEP_S * 1000:.0f} ms a step, prefill workers at {PREFILL_TOK_S:.0f}"
        f" prompt tokens/s one prompt at a time, each role 1..{MAX_REPLICAS}; a pod Ready 60 s after its creation"
        " (60-300 s in that family), the node of the last two families holding 8 pods. The operator at the API's"
        f" defaults (decisions every {rules.interval_seconds:.0f} s, scale-down window {rules.down_window:.0f} s,"
        f" tolerance {rules.tolerance:.0%}), targets 80 % lane occupancy and 70 % prefill busy time for every"
        f" controller. In the TTFT bound: first token within the request's own prefill + {TTFT_SLACK_S:.0f} s"
        " (requests of the last minute left out). Pod-seconds count pods from their placement on the node."
        " Reversals: changes of a role's desired count opposite to its previous change. Step: the load's rate or"
        " mix jumps and the oracle's need rises; timed until both roles are Ready at that need. Goals (issue):"
        " SLO >= min(static, oracle) - 10 points; every shape's reversals per role <= max(3, the oracle's);"
        " pod-seconds <= 1.5x the oracle's; never worse than HPA on SLO and cost at once.",
        f"Run in {elapsed:.0f} s with {args.jobs} processes.",
        "",
        *lines,
        "",
        slow_start_line(rows),
        "",
    ]
    text = "\n".join(head)
    print(text)
    if args.shapes >= 200:
        args.out.write_text(text + kept_readings(args.out))


def kept_readings(path: Path) -> str:
    """The hand-written readings of the file being rewritten, from their heading on ("" when it has none)."""
    text = path.read_text() if path.exists() else ""
    at = text.find(READINGS)
    return "\n" + text[at:] if at >= 0 else ""


if __name__ == "__main__":
    main()
