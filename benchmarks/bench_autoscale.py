"""`make bench-autoscale`: the autoscaler end to end on the real-kubelet node (issue 33, shared/autoscaling-design.md
section 8.3), writing benchmarks/results/autoscaling.md.

The chart's operator (helm) scales one AtomDeployment of paced engines (decode 50 ms a step, 4 lanes; prefill 2 ms a
prompt token: capacities set by design, not by the shared CPU; benchmarks/autoscale_images.py) on the real node
(kubelet + containerd, 4 fake NPUs from a real device plugin, kube-proxy). A client pod sends streams to the Service
(benchmarks/autoscale_client.py), open-loop Poisson arrivals or closed loop (a number of streams kept in flight),
through phases that need different pod counts; the bench watches the AtomDeployment and its pods (every change,
timestamped, plus a 1 s timeline), reads every engine pod's gauges every second and at the moment a pod is cordoned,
and checks what issue 33's "Checked by" asks:

- zero failed requests across drained scale-downs whose victim had requests running when cordoned;
- the negative control: the same scale-down with autoscaling Off (a plain replicas decrease) cuts a stream;
- desired counts vs the pacing arithmetic after each step, pairs inside the band, changes per steady phase;
- reaction: load step -> desired change, in decision intervals, both roles in one decision; a step on a full node
  that takes an NPU from the other role (a trade) timed against that role's scale-down window.

    python -m benchmarks.bench_autoscale [--no-build] [--phases decode|all] [--no-control] [--raw DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script (make bench-autoscale): tests.realnode and benchmarks.* from here
    sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results" / "autoscaling.md"
NAME = "tiny"
ACCEPTING = "serving.atom.dev/accepting"
ROLE_LABEL = "app.kubernetes.io/component"
HTTP_PORT = 8000

# The spec under test (design 8.3, shortened windows so the run fits ~25 minutes on 2 shared cores).
INTERVAL = 5
SCALE_DOWN_WINDOW = 30
LANES = 4
DECODE_STEP_S = 0.050
PREFILL_S_PER_TOKEN = 0.002
OCCUPANCY = 0.80
UTILIZATION = 0.70
BAND = ((1, 3), (3, 1))  # (prefill, decode) pairs: fewest and most prefill per decode
BOUNDS = {"decode": (1, 3), "prefill": (1, 3)}
NODE_NPUS = 4  # the real node's device plugin (its default --devices), one NPU a pod
TRADE_INTERVALS = SCALE_DOWN_WINDOW / INTERVAL + 2  # a trade waits for the other role's scale-down window
AUTOSCALING = {
    "mode": "Operator",
    "intervalSeconds": INTERVAL,
    "decode": {"minReplicas": 1, "maxReplicas": 3, "targetOccupancyPercent": int(OCCUPANCY * 100)},
    "prefill": {"minReplicas": 1, "maxReplicas": 3, "targetUtilizationPercent": int(UTILIZATION * 100)},
    "ratio": {
        "min": {"prefill": BAND[0][0], "decode": BAND[0][1]},
        "max": {"prefill": BAND[1][0], "decode": BAND[1][1]},
    },
    "behavior": {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW}},
    "drain": {"timeoutSeconds": 180},
}

# Phases: name, seconds, ISL, OSL and either rate/s (open-loop Poisson arrivals, burst at start) or concurrency (closed
# loop: streams kept in flight), as benchmarks/autoscale_client.py reads them.
#
# G6, G3: decode scale-downs (3 -> 2, then 2 -> 1) whose victim is busy at the cordon. The operator drains the idlest
# pod, so its victim is busy only when every pod has a stream: open-loop long streams left some pod empty at every
# cordon of the first runs. Closed loop, the pods hold a steady number of long streams (OSL 800 = 40 s at the pace), the
# most that one pod fewer serves (3.2 a pod), and kube-proxy's random spread leaves no pod empty about 3 times in 4 (6
# streams on 3 pods, 3 on 2). Each phase must hold its scale-down up to the pod's removal: what the phase before left in
# flight ends first (B's queue took 30-40 s to drain in the first runs; G6's streams run up to 40 s into G3, the client
# lets them end before starting G3's), then the 30 s window and a decision, then the drain until the victim's streams
# end (up to 40 s): about 120 s, hence 150.
# Each stream's length is drawn within 30 % of 700 (the mean, which the arithmetic uses): streams started together
# would otherwise end together, and the closed loop would send its arrivals in lockstep batches of 6 every 40 s
# (the first run with these phases: a burst every 41 s, which the decision rightly read as steps). The longest,
# 910 tokens after a 100-token prompt, fits MAX_SEQ_LEN (checked at the start of a run).
LONG_STREAMS = [
    {"name": "G6 6 long streams (closed loop)", "seconds": 150, "concurrency": 6, "isl": 100, "osl": 700,
     "osl_jitter": 0.3},
    {"name": "G3 3 long streams (closed loop)", "seconds": 150, "concurrency": 3, "isl": 100, "osl": 700,
     "osl_jitter": 0.3},
]  # fmt: skip
DECODE_PHASES = [
    {"name": "A warm", "seconds": 60, "rate": 0.2, "isl": 200, "osl": 100},
    {"name": "B decode-heavy", "seconds": 150, "rate": 1.5, "isl": 200, "osl": 100},
    *LONG_STREAMS,
]
# E1, E2: a load beyond the node, entered from C3's 3+1. Streams join C3's prompts: both targets become 3 (decode
# 6.8 lanes / 3.2, prefill 2.05 busy / 0.7) and the node's 4 NPUs hold 2+2 at best, so prefill gives up a worker
# while its workers hold C3's prompts (a scale-down on load falling drains an idle worker: the operator drains the
# idlest, and a worker computes one prompt at a time). C3b between them returns to 3+1. Run 9 ran these phases with
# 1.25 prompts/s (2.55 busy): two workers could not keep up, and the queue lasted into C1; 1.0/s is 1.03 of two
# workers' speed.
BEYOND_THE_NODE = {"rate": 1.25, "isl": 820, "osl": 76, "mix": [[4, 1000, 20], [1, 100, 300]]}
# H1, H2: prefill scale-downs whose victims are busy at the cordon. The operator drains the idlest worker, and a
# worker computes one prompt at a time, so a scale-down on load falling finds an idle one (runs 5 to 10: 0 to 3 busy
# a run, most of them from the yield's flips). A platform team lowering the cap under load is the scale-down that
# finds every worker busy: H1 holds 3 workers past their speed (1.5 prompts/s of 1000 tokens is 3.0 worker-seconds
# a second; a short answer keeps decode's one pod within its lanes: 3.15 lanes), and H2 lowers
# autoscaling.prefill.maxReplicas to 1 at its start, while the workers still hold H1's queue: two victims, cordoned
# together, each finishing its prompts first. C2 lowers the cap the same way while E2's queue holds both workers
# (run 12: H1 had not reached 3 running workers when H2 began, its third still Pending). ``spec`` is merge-patched
# into the AtomDeployment when the client starts the phase; the optimum reads the bounds it sets.
CAPPED = [
    {"name": "H1 prefill past its speed", "seconds": 150, "rate": 1.5, "isl": 1000, "osl": 2},
    {"name": "H2 prefill capped at 1", "seconds": 90, "rate": 0.4, "isl": 1000, "osl": 20,
     "spec": {"autoscaling": {"prefill": {"maxReplicas": 1}}}},
]  # fmt: skip
PREFILL_PHASES = [
    {"name": "C3 prefill-heavy", "seconds": 150, "rate": 1.0, "isl": 1000, "osl": 20},
    {"name": "E1 streams join, beyond the node", "seconds": 150, **BEYOND_THE_NODE},
    {"name": "C3b prefill-heavy again", "seconds": 120, "rate": 1.0, "isl": 1000, "osl": 20},
    {"name": "E2 streams join again", "seconds": 90, **BEYOND_THE_NODE},
    {"name": "C2 prefill, less, capped at 1", "seconds": 90, "rate": 0.5, "isl": 1000, "osl": 20,
     "spec": {"autoscaling": {"prefill": {"maxReplicas": 1}}}},
    # C1 keeps C2's cap (its patch repeats it, so its optimum reads it): restored at C1's start, prefill grew on
    # C2's queue and came down in steps through C1 and into D (run 13).
    {"name": "C1 prefill, light", "seconds": 90, "rate": 0.2, "isl": 1000, "osl": 20,
     "spec": {"autoscaling": {"prefill": {"maxReplicas": 1}}}},
    # Both roles must grow from 1+1: half 200/200, half 1000/20 at 1.0/s: decode 0.5 x 10 s + 0.5 x 1 s of decode
    # and 1.2 s of prompts computing = 6.7 lanes / 3.2 -> 3; prefill 600 tok/s x 2 ms = 1.2 busy / 0.7 -> 2 (2+3:
    # more than the node's 4 NPUs, so InsufficientNPUs shares them: 2+2, which expected() gives). D restores the cap.
    {"name": "D both", "seconds": 120, "rate": 1.0, "isl": 600, "osl": 110, "mix": [[1, 200, 200], [1, 1000, 20]],
     "spec": {"autoscaling": {"prefill": {"maxReplicas": 3}}}},
    *CAPPED,
]
# --phases drains: scale-downs whose victims are busy (the decode ones: LONG_STREAMS above).
DRAIN_PHASES = [
    {"name": "A warm", "seconds": 30, "rate": 0.2, "isl": 200, "osl": 100},
    {"name": "B decode-heavy", "seconds": 120, "rate": 1.5, "isl": 200, "osl": 100},
    *LONG_STREAMS,
    {"name": "P3 prefill for 3", "seconds": 90, "rate": 0.8, "isl": 1000, "osl": 20},
    {"name": "P2 prefill for 2", "seconds": 90, "rate": 0.45, "isl": 1000, "osl": 20},
    {"name": "P1 prefill for 1", "seconds": 75, "rate": 0.3, "isl": 1000, "osl": 20},
]
MAX_SEQ_LEN = 1024  # the deployment's context: every phase's longest request must fit (else 400s, not load)


def longest(phase: dict) -> int:
    """The most tokens one of the phase's requests asks for: its prompt and its longest max_tokens."""
    mix = phase.get("mix") or [[1, phase["isl"], phase["osl"]]]
    return max(isl + math.floor(osl * (1 + phase.get("osl_jitter", 0)) + 0.5) for _, isl, osl in mix)


CONTROL_STREAMS = 8  # the negative control: long streams on two decode pods, then a plain replicas decrease

PEERS = [
    ("this operator (spec above)", f"decision every {INTERVAL} s; scale-down window {SCALE_DOWN_WINDOW} s"),
    ("Kubernetes HPA", "sync period 15 s; scale-down stabilization 300 s by default"),
    ("KEDA (llm-d guides)", "polling 15 s; 300 s cooldown / stabilization windows"),
    ("Dynamo planner, load mode", "adjustment interval 5 s, +-1 replica per interval (throughput mode 180 s)"),
    ("AIBrix KPA", "60 s panic window / 180 s stable window"),
]


def arrival_rate(phase: dict) -> float:
    """Requests a second: an open-loop phase's rate; a closed-loop phase's by Little's law, its streams in flight
    over the time a stream takes at the pace (its prefill, then its decode)."""
    if not phase.get("concurrency"):
        return phase["rate"]
    mix = phase.get("mix") or [[1, phase["isl"], phase["osl"]]]
    total = sum(w for w, _, _ in mix)
    stream_s = sum(w / total * (isl * PREFILL_S_PER_TOKEN + osl * DECODE_STEP_S) for w, isl, osl in mix)
    return phase["concurrency"] / stream_s


def load_of(phase: dict) -> str:
    return f"closed loop {phase['concurrency']}" if phase.get("concurrency") else f"{phase['rate']}"


def targets(phase: dict) -> tuple[int, int]:
    """The pacing arithmetic: decode holds a lane for isl x 2 ms while a worker computes the prompt, then for
    osl x 50 ms (a longer wait for a remote KV is prefill's shortfall, not decode demand), 4 lanes at 80 %; prefill
    2 ms a token at 70 %. (prefill, decode)."""
    mix = phase.get("mix") or [[1, phase["isl"], phase["osl"]]]
    total = sum(w for w, _, _ in mix)
    rate = arrival_rate(phase)
    seq = sum(rate * w / total * (osl * DECODE_STEP_S + isl * PREFILL_S_PER_TOKEN) for w, isl, osl in mix)
    busy = sum(rate * w / total * isl * PREFILL_S_PER_TOKEN for w, isl, _ in mix)
    b = bounds_of(phase)
    d = min(b["decode"][1], max(b["decode"][0], math.ceil(round(seq / (LANES * OCCUPANCY), 6))))
    p = min(b["prefill"][1], max(b["prefill"][0], math.ceil(round(busy / UTILIZATION, 6))))
    return p, d


def bounds_of(phase: dict) -> dict[str, tuple[int, int]]:
    """The replica bounds during a phase: AUTOSCALING's, or those its ``spec`` patch sets."""
    patch = (phase.get("spec") or {}).get("autoscaling") or {}
    return {
        role: ((patch.get(role) or {}).get("minReplicas", lo), (patch.get(role) or {}).get("maxReplicas", hi))
        for role, (lo, hi) in BOUNDS.items()
    }


def expected(phase: dict) -> tuple[int, int]:
    """The optimum the node can hold: the targets where they fit its NPUs (one a pod), else the pair inside the
    bounds and the band that serves the larger share of the worse-served role (max of min(got / target)), then
    the one with fewer pods. What a platform team would pick by hand for a load beyond the node."""
    p_t, d_t = targets(phase)
    if p_t + d_t <= NODE_NPUS:
        return p_t, d_t
    b = bounds_of(phase)
    pairs = [
        (p, d)
        for p in range(b["prefill"][0], b["prefill"][1] + 1)
        for d in range(b["decode"][0], b["decode"][1] + 1)
        if p + d <= NODE_NPUS and in_band(p, d)
    ]
    return max(pairs, key=lambda pd: (min(min(1, pd[0] / p_t), min(1, pd[1] / d_t)), -(pd[0] + pd[1])))


def in_band(p: int, d: int) -> bool:
    (pmin, dmin), (pmax, dmax) = BAND
    return p * dmin >= pmin * d and p * dmax <= pmax * d


BUSIEST_SECONDS = 10.0  # the span the drawn arrivals' busiest stretch is counted over
BUSIEST_DRAWS = 1000  # draws of the same phase the busiest stretch is compared with
RARE_DRAW = 0.01  # a phase drawn busier than all but this share of its draws is named beside its verdicts


def busiest(starts: list[float], span: float = BUSIEST_SECONDS) -> int:
    """The most arrivals within any ``span`` seconds."""
    starts = sorted(starts)
    most, j = 0, 0
    for i, s in enumerate(starts):
        while j < len(starts) and starts[j] < s + span:
            j += 1
        most = max(most, j - i)
    return most


def as_busy_share(count: int, rate: float, seconds: float, draws: int = BUSIEST_DRAWS) -> float:
    """The share of open-loop phases of this rate and length, drawn as the client draws them (exponential gaps),
    whose busiest stretch holds at least ``count`` arrivals: how unusual the drawn schedule is. The optimum column
    is the phase's mean rate; a stretch that few draws reach is load the decision may rightly read as a step."""
    rng = random.Random(0)
    hits = 0
    for _ in range(draws):
        at, starts = 0.0, []
        while (at := at + rng.expovariate(rate)) < seconds:
            starts.append(at)
        hits += busiest(starts) >= count
    return hits / draws


def now() -> float:
    return time.time()


def log(msg: str) -> None:
    print(f"[{dt.datetime.now(dt.UTC).strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- observation ---------------------------------------------------------------------------------------------
GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "atom:requests_in_flight",
    "atom:pd_waiting_for_kv",
    "atom:prefill_tokens_waiting",
)


def gauges(ip: str) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://{ip}:{HTTP_PORT}/metrics", timeout=2) as r:
            text = r.read().decode()
    except Exception:  # noqa: BLE001 - a pod not answering is recorded as None
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in GAUGES:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@dataclass
class PodState:
    name: str
    role: str
    accepting: str | None
    ip: str | None
    ready: bool
    deleting: bool
    cost: str | None


def pod_state(obj: dict) -> PodState:
    md, st = obj["metadata"], obj.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])
    return PodState(
        md["name"],
        md.get("labels", {}).get(ROLE_LABEL, "?"),
        md.get("labels", {}).get(ACCEPTING),
        st.get("podIP"),
        ready,
        bool(md.get("deletionTimestamp")),
        (md.get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost"),
    )


class Observer:
    """kubectl watches of the AtomDeployment and its pods (every change, timestamped), the engines' gauges every
    second and at each cordon, and a 1 s timeline of the lot."""

    def __init__(self, cluster, namespace: str, raw: Path) -> None:  # noqa: ANN001
        self.cluster, self.ns, self.raw = cluster, namespace, raw
        self.pods: dict[str, PodState] = {}
        self.owner: dict = {}
        self.pod_events: list[dict] = []
        self.owner_events: list[dict] = []
        self.cordons: list[dict] = []
        self.gauge_now: dict[str, dict] = {}
        self.timeline: list[dict] = []
        self.stop = threading.Event()
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()
        self.events_seen = 0

    def _watch(self, args: list[str], on_obj) -> None:  # noqa: ANN001
        while not self.stop.is_set():
            cmd = [
                str(self.cluster.kubectl_path),
                "--kubeconfig",
                str(self.cluster.kubeconfig),
                "get",
                *args,
                "-n",
                self.ns,
                "--watch",
                "-o",
                "json",
                "--output-watch-events",
                "--request-timeout=0",
            ]
            errlog = open(self.raw / f"watch-{args[0].split('.')[0]}.stderr", "ab")  # noqa: SIM115
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errlog)
            self.procs.append(proc)
            assert proc.stdout is not None
            decoder = json.JSONDecoder()
            buf = ""
            while True:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk.decode(errors="replace")
                while True:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    try:
                        ev, end = decoder.raw_decode(buf)
                    except json.JSONDecodeError:
                        break  # incomplete: read more
                    buf = buf[end:]
                    if isinstance(ev, dict) and "object" in ev:
                        self.events_seen += 1
                        try:
                            on_obj(ev, now())
                        except Exception as e:  # noqa: BLE001 - a bad event must not end the watch
                            log(f"watch {args[0]}: {type(e).__name__}: {e}")
            proc.wait()
            time.sleep(0.5)

    def _on_pod(self, ev: dict, t: float) -> None:
        obj = ev["object"]
        if obj.get("kind") != "Pod":
            return
        new = pod_state(obj)
        gone = ev.get("type") == "DELETED"
        with self.lock:
            old = self.pods.get(new.name)
            if gone:
                self.pods.pop(new.name, None)
            else:
                self.pods[new.name] = new
            self.pod_events.append({"t": t, "type": ev.get("type"), **new.__dict__})
        if old and old.accepting != "false" and new.accepting == "false" and not gone:
            rec = {"t": t, "pod": new.name, "role": new.role, "last_sample": self.gauge_now.get(new.name)}
            if new.ip:
                rec["at_cordon"] = gauges(new.ip)
                rec["at_cordon_t"] = now()
            with self.lock:
                self.cordons.append(rec)
            log(f"cordon {new.name} ({new.role}): at cordon {rec.get('at_cordon')}")
        if old and old.accepting == "false" and new.accepting == "true" and not gone:
            with self.lock:
                self.cordons.append({"t": t, "pod": new.name, "role": new.role, "uncordon": True})
            log(f"uncordon {new.name}")

    def _on_owner(self, ev: dict, t: float) -> None:
        obj = ev["object"]
        st = obj.get("status") or {}
        rec = {
            "t": t,
            "generation": obj["metadata"].get("generation"),
            "spec_mode": (obj["spec"].get("autoscaling") or {}).get("mode"),
            "autoscaling": st.get("autoscaling"),
            "conditions": [
                {k: c.get(k) for k in ("type", "status", "reason", "message")} for c in st.get("conditions") or []
            ],
            "decode": st.get("decode"),
            "prefill": st.get("prefill"),
        }
        with self.lock:
            self.owner = rec
            self.owner_events.append(rec)

    def _poll(self) -> None:
        while not self.stop.is_set():
            began = now()
            with self.lock:
                live = [p for p in self.pods.values() if p.ip]
            for p in live:
                g = gauges(p.ip)
                if g is not None:
                    self.gauge_now[p.name] = {"t": now(), **g}
            with self.lock:
                a = self.owner.get("autoscaling") or {}
                self.timeline.append(
                    {
                        "t": began,
                        "desired": {r: (a.get(r) or {}).get("desiredReplicas") for r in ("prefill", "decode")},
                        "recommended": {r: (a.get(r) or {}).get("recommendedReplicas") for r in ("prefill", "decode")},
                        "ready": {r: (self.owner.get(r) or {}).get("readyReplicas") for r in ("prefill", "decode")},
                        "reason": a.get("reason"),
                        "limited": next(
                            (c for c in self.owner.get("conditions", []) if c["type"] == "ScalingLimited"), None
                        ),
                        "pods": {
                            p.name: {
                                "role": p.role,
                                "accepting": p.accepting,
                                "ready": p.ready,
                                "deleting": p.deleting,
                                "gauges": self.gauge_now.get(p.name),
                            }
                            for p in self.pods.values()
                        },
                    }
                )
            time.sleep(max(0.0, 1.0 - (now() - began)))

    def start(self) -> None:
        for target, fn in (
            (["pods", "-l", f"app.kubernetes.io/instance={NAME}"], self._on_pod),
            (["atomdeployments.serving.atom.dev", NAME], self._on_owner),
        ):
            threading.Thread(target=self._watch, args=(target, fn), daemon=True).start()
        threading.Thread(target=self._poll, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for name, data in (
            ("pod_events", self.pod_events),
            ("owner_events", self.owner_events),
            ("cordons", self.cordons),
            ("timeline", self.timeline),
        ):
            (self.raw / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in data))


# ---- the client -------------------------------------------------------------------------------------------
class Client:
    def __init__(self, cluster, namespace: str, url: str, model: str, raw: Path, label: str,  # noqa: ANN001
                 on_phase: Callable[[dict], None] | None = None) -> None:  # fmt: skip
        self.cluster, self.ns, self.url, self.model, self.raw, self.label = cluster, namespace, url, model, raw, label
        self.on_phase = on_phase  # called with each phase's record as the client starts it
        self.lines: list[dict] = []
        self.proc: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None

    def start(self, schedule: list[dict], seed: int) -> None:
        script = (REPO / "benchmarks" / "autoscale_client.py").read_text()
        cmd = [
            str(self.cluster.kubectl_path),
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "exec",
            "-n",
            self.ns,
            "client",
            "--",
            "python3",
            "-c",
            script,
            self.url,
            self.model,
            json.dumps(schedule),
            str(seed),
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    rec = {"event": "noise", "line": line.strip()}
                self.lines.append(rec)
                if rec.get("event") == "phase":
                    log(f"phase {rec['name']}")
                    if self.on_phase is not None:
                        self.on_phase(rec)
                elif rec.get("event") == "request" and not rec.get("ok"):
                    log(f"FAILED request {rec}")

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    def wait(self, timeout: float) -> None:
        assert self.proc is not None and self.reader is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.reader.join(10)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        if err.strip():
            log(f"client stderr: {err.strip()[-500:]}")
        (self.raw / f"client-{self.label}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in self.lines))

    def requests(self) -> list[dict]:
        return [x for x in self.lines if x.get("event") == "request"]

    def phases(self) -> list[dict]:
        return [x for x in self.lines if x.get("event") == "phase"]


# ---- the run ----------------------------------------------------------------------------------------------
def deployment() -> dict:
    from atom_localcluster import chart

    obj = chart.atomdeployment(NAME)
    spec = obj["spec"]
    spec["model"]["maxSeqLen"] = MAX_SEQ_LEN
    spec["decode"].update({"lanes": LANES, "kvBlocks": LANES + 2, "prefixCache": False, "speculativeTokens": 0})
    spec["autoscaling"] = AUTOSCALING
    return obj


def wait_for(probe, timeout: float, what: str):  # noqa: ANN001, ANN201
    deadline = now() + timeout
    while now() < deadline:
        v = probe()
        if v:
            return v
        time.sleep(1)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def run(args: argparse.Namespace) -> dict:
    from atom_localcluster import chart
    from atom_localcluster.images import base, daemon
    from atom_localcluster.realnode import RealNodeCluster

    from benchmarks import autoscale_cluster as scenario
    from benchmarks import autoscale_images

    raw = Path(args.raw)
    raw.mkdir(parents=True, exist_ok=True)
    info: dict = {"started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "load_start": os.getloadavg()}
    t0 = now()
    daemon.ensure_daemon()
    tags = (
        {"operator": autoscale_images.OPERATOR_TAG, "paced": autoscale_images.PACED_TAG}
        if args.no_build
        else autoscale_images.build_all()
    )
    info["build_s"] = now() - t0
    # The commit the images were built from (their label), not the checkout's HEAD now: others commit meanwhile.
    info["head"] = autoscale_images.commit_of(tags["paced"])
    client_image = base.base_image()
    node = RealNodeCluster(nodes=())
    t1 = now()
    node.start()
    try:
        for ref in (tags["operator"], tags["paced"], client_image):
            s = now()
            node.import_image(ref)
            log(f"imported {ref} in {now() - s:.0f}s")
        info["cluster_s"] = now() - t1
        chart.helm_install(node, tags["operator"], tags["paced"])
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        node.kubectl("create", "namespace", ns)
        node.apply(chart.client_pod(client_image), "-n", ns)
        obs = Observer(node, ns, raw)
        obs.start()
        t2 = now()
        node.apply(deployment(), "-n", ns)
        scenario.wait_ready(node, ns, NAME, timeout=600)
        info["ready_s"] = now() - t2
        log(f"AtomDeployment Ready in {info['ready_s']:.0f}s")
        wait_for(
            lambda: all(
                c["ready"]
                for c in node.get("pod", "client", "-n", ns)["status"].get("containerStatuses", [{"ready": False}])
            ),
            120,
            "the client pod",
        )
        wait_for(
            lambda: any(p.role == "decode" and p.ip for p in obs.pods.values()) and obs.owner,
            60,
            "the watches to see the pods and the AtomDeployment",
        )
        decode_pod = next(p for p in obs.pods.values() if p.role == "decode" and p.ip)
        with urllib.request.urlopen(f"http://{decode_pod.ip}:{HTTP_PORT}/v1/models", timeout=10) as r:
            model = json.load(r)["data"][0]["id"]
        url = f"http://{NAME}.{ns}.svc:{HTTP_PORT}/v1/completions"
        schedule = list(DECODE_PHASES) + (list(PREFILL_PHASES) if args.phases == "all" else [])
        if args.phases == "drains":
            schedule = list(DRAIN_PHASES)
        if args.smoke:
            schedule = [dict(DECODE_PHASES[0], seconds=30)]
        info["schedule"] = schedule
        def patch_phase(rec: dict) -> None:
            if rec.get("spec"):
                scenario.patch_spec(node, ns, NAME, rec["spec"])
                log(f"patched spec with {json.dumps(rec['spec'])}")

        main = Client(node, ns, url, model, raw, "autoscaled", on_phase=patch_phase)
        main.start(schedule, seed=33)
        main.wait(sum(p["seconds"] for p in schedule) + 300)
        info["load_after_main"] = os.getloadavg()
        # Let the last scale-down finish before the control (it needs the pods it leaves).
        if not args.smoke:
            try:
                wait_for(lambda: not any(p.accepting == "false" for p in obs.pods.values()), 240, "drains to end")
            except TimeoutError as e:
                log(str(e))
        control = None
        if not args.no_control and not args.smoke:
            control = negative_control(node, ns, url, model, raw, obs)
        events = node.kubectl("get", "events", "-n", ns, "-o", "json", check=False).stdout
        (raw / "events.json").write_text(events)
        obs.close()
        info["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        info["load_end"] = os.getloadavg()
        info["total_s"] = now() - t0
        (raw / "info.json").write_text(json.dumps(info))
        if control:
            (raw / "control.json").write_text(json.dumps({k: v for k, v in control.items() if k != "client"}))
        return {"info": info, "main": main, "control": control, "obs": obs, "events": json.loads(events or "{}")}
    finally:
        try:
            chart.helm_uninstall(node)
        finally:
            keep_dns_log(node, raw)
            node.stop()


def keep_dns_log(node, raw: Path) -> None:  # noqa: ANN001
    """The node's DNS (nodegw) logs every query: who asked, the answer, how it was had and how long it waited. A
    client's gaierror is read there (run 22's H1: 48 s of failed name lookups, after the node's directory was gone)."""
    with contextlib.suppress(StopIteration, OSError):
        shutil.copyfile(node.component("nodegw").log, raw / "nodegw.log")


def negative_control(node, ns: str, url: str, model: str, raw: Path, obs: Observer) -> dict:  # noqa: ANN001
    """The same scale-down without the drain: mode Off, two decode pods, long streams on both, replicas 2 -> 1."""
    from benchmarks import autoscale_cluster as scenario

    log("negative control: mode Off, decode replicas 2")
    scenario.patch_spec(
        node, ns, NAME, {"autoscaling": {"mode": "Off"}, "decode": {"replicas": 2}, "prefill": {"replicas": 1}}
    )
    wait_for(
        lambda: (
            sum(1 for p in obs.pods.values() if p.role == "decode" and p.ready and not p.deleting) == 2
            and not any(p.deleting for p in obs.pods.values())
        ),
        300,
        "two Ready decode pods (mode Off)",
    )
    ctl = Client(node, ns, url, model, raw, "control")
    ctl.start([{"name": "control", "seconds": 1, "rate": 0, "isl": 200, "osl": 800, "burst": CONTROL_STREAMS}], seed=7)
    time.sleep(8)  # prefilled and decoding on both pods
    before = {n: obs.gauge_now.get(n) for n, p in obs.pods.items() if p.role == "decode"}
    t = now()
    scenario.patch_spec(node, ns, NAME, {"decode": {"replicas": 1}})
    log(f"negative control: replicas 1 at {t:.0f}; gauges before {before}")
    ctl.wait(240)
    return {"client": ctl, "scaled_at": t, "gauges_before": before}


# ---- analysis ---------------------------------------------------------------------------------------------
def shape_of(p: dict) -> str:
    if p.get("mix"):
        return " + ".join(f"{isl}/{osl}" for _, isl, osl in p["mix"])
    return f"{p['isl']}/{p['osl']}"


def grace() -> int:
    from atom_operator.children.workload import TERMINATION_GRACE_SECONDS

    return TERMINATION_GRACE_SECONDS


def fmt_t(t: float, base: float) -> str:
    return f"{t - base:+.0f}s"


def analyse(res: dict) -> str:  # noqa: C901, PLR0912, PLR0915
    info, main, obs = res["info"], res["main"], res["obs"]
    reqs = main.requests()
    phases = main.phases()
    base = phases[0]["t"] if phases else obs.timeline[0]["t"]
    end_main = max((r["end"] for r in reqs), default=base)
    bounds = [
        (p["name"], p["t"], phases[i + 1]["t"] if i + 1 < len(phases) else end_main, p) for i, p in enumerate(phases)
    ]
    closed = any(p.get("concurrency") for p in phases)
    out: list[str] = []
    w = out.append
    la = info
    w("# Autoscaling on the real-kubelet node (`make bench-autoscale`)\n")
    w(
        f"Run {info['started']} -> {info['finished']} UTC, commit {info['head']}"
        " (images built from `git archive HEAD`);"
        f" load average at start {la['load_start'][0]:.2f} / {la['load_start'][1]:.2f} / {la['load_start'][2]:.2f},"
        f" after the load phases {la['load_after_main'][0]:.2f}, at the end {la['load_end'][0]:.2f}"
        " (2 shared cores; other work ran on the machine meanwhile)."
        f" Whole run {info['total_s'] / 60:.1f} min (images {info['build_s']:.0f} s, node + image import"
        f" {info['cluster_s']:.0f} s, first Ready {info['ready_s']:.0f} s).\n"
    )
    w(
        "Setup: the chart's operator (helm), the real node (kubelet + containerd, 4 fake NPUs from the device plugin,"
        " kube-proxy), one AtomDeployment `tiny` (builtin:tiny, cpu backend, one NPU a pod) whose engines run the"
        " test-only paced runner (decode 50 ms a step, 4 lanes; prefill 2 ms a prompt token), autoscaling"
        f" `{json.dumps(AUTOSCALING)}`. An in-cluster client pod sends open-loop Poisson streams"
        " (`/v1/completions`, `ignore_eos`, random token-id prompts) to the Service's DNS name"
        + (
            ", closed loop where the rate column says so (that many streams kept in flight, the next started when one"
            " ends).\n"
            if closed
            else ".\n"
        )
    )

    # -- requests
    def failed(rs: list[dict]) -> list[dict]:
        return [r for r in rs if not r.get("ok")]

    summary_at = len(out)
    w("## Requests per phase\n")
    w(
        "| Phase | s | rate/s | ISL/OSL | requests | failed | TTFT p50 / p90 (s) | expected P+D | desired at end P+D |"
        " ready at end P+D | changes P / D after the first |"
    )
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    phase_rows = []
    for name, t_a, t_b, p in bounds:
        rs = [r for r in reqs if r["phase"] == name]
        ttft = sorted(r["first"] - r["start"] for r in rs if r.get("first"))

        def q(x: float, ttft: list[float] = ttft) -> str:
            return f"{ttft[min(len(ttft) - 1, int(x * len(ttft)))]:.2f}" if ttft else "-"

        exp = expected(p)
        fitted = f" (targets {'+'.join(map(str, targets(p)))}; {NODE_NPUS} NPUs)" if exp != targets(p) else ""
        tl = [s for s in obs.timeline if t_a <= s["t"] < t_b]
        last = tl[-1] if tl else None
        des = (last["desired"]["prefill"], last["desired"]["decode"]) if last else (None, None)
        rdy = (last["ready"]["prefill"], last["ready"]["decode"]) if last else (None, None)
        changes = {}
        for role in ("prefill", "decode"):
            seq = [s["desired"][role] for s in tl if s["desired"][role] is not None]
            n = sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b)
            changes[role] = max(0, n - 1)  # the step's own change is the reaction, not instability
        phase_rows.append(
            {"name": name, "expected": exp, "targets": targets(p), "desired": des, "changes": changes, "t": t_a,
             "end": t_b}
        )  # fmt: skip
        w(
            f"| {name} | {p['seconds']} | {load_of(p)} | {shape_of(p)} | {len(rs)} | {len(failed(rs))} |"
            f" {q(0.5)} / {q(0.9)} | {exp[0]}+{exp[1]}{fitted} | {des[0]}+{des[1]} | {rdy[0]}+{rdy[1]} |"
            f" {changes['prefill']} / {changes['decode']} |"
        )
    all_failed = failed(reqs)
    w(
        f"\nAll phases: {len(reqs)} requests, **{len(all_failed)} failed** (a failure: not HTTP 200, no `[DONE]`, no"
        " finish_reason, or completion_tokens != max_tokens)."
    )
    for r in all_failed[:10]:
        w(
            f"- failed: id {r['id']} phase {r['phase']} status {r['status']} done {r['done']} finish {r['finish']}"
            f" tokens {r['completion_tokens']}/{r['osl']} error {r['error']}"
        )
    w("")

    # -- the drawn arrivals, beside the mean rate the optimum is computed from
    w(f"## Arrivals as drawn (open-loop phases; busiest {BUSIEST_SECONDS:.0f} s against the phase's rate)\n")
    w(f"| Phase | requests (at the rate) | busiest {BUSIEST_SECONDS:.0f} s (at the rate) |"
      f" draws of the phase at least as busy (of {BUSIEST_DRAWS}) |")  # fmt: skip
    w("|---|---|---|---|")
    rare: dict[str, float] = {}  # phases drawn busier than all but RARE_DRAW of their draws
    for name, t_a, _, p in bounds:
        if p.get("concurrency") or not p.get("rate"):
            continue
        starts = [r["start"] - t_a for r in reqs if r["phase"] == name]
        most = busiest(starts)
        share = as_busy_share(most, p["rate"], p["seconds"])
        if share < RARE_DRAW:
            rare[name] = share
        w(f"| {name} | {len(starts)} ({p['rate'] * p['seconds']:.0f}) | {most} ({p['rate'] * BUSIEST_SECONDS:.1f}) |"
          f" {share * BUSIEST_DRAWS:.0f} |")  # fmt: skip
    w("")

    # -- drains
    w("## Scale-downs: cordon -> gone\n")
    w(
        "| Pod | Role | cordoned at | running / in flight at cordon (read at the watch event) | pod deleting at |"
        " un-cordoned | victim at cordon |"
    )
    w("|---|---|---|---|---|---|---|")
    qualifying = {"decode": 0, "prefill": 0}
    drains = []
    for c in obs.cordons:
        if c.get("uncordon"):
            continue
        deleting = next(
            (e["t"] for e in obs.pod_events if e["name"] == c["pod"] and e["deleting"] and e["t"] >= c["t"]), None
        )
        unc = next(
            (x["t"] for x in obs.cordons if x.get("uncordon") and x["pod"] == c["pod"] and x["t"] > c["t"]), None
        )
        g = c.get("at_cordon") or {}
        running = g.get("vllm:num_requests_running")
        flight = g.get("atom:requests_in_flight")
        busy = (running or 0) > 0 or (flight or 0) > 0
        if busy and deleting and not unc:
            qualifying[c["role"]] += 1
        drains.append({**c, "deleting": deleting, "uncordon_t": unc, "busy": busy})
        took = f"{fmt_t(deleting, base)} ({deleting - c['t']:.0f} s after)" if deleting else "-"
        w(
            f"| {c['pod']} | {c['role']} | {fmt_t(c['t'], base)} | {running} / {flight} | {took} |"
            f" {fmt_t(unc, base) if unc else 'no'} | {'busy' if busy else 'idle'} |"
        )
    w(
        f"\nDrained scale-downs whose victim had requests running when cordoned and that ended in the pod's removal:"
        f" decode {qualifying['decode']}, prefill {qualifying['prefill']} (criterion: >= 2 per role).\n"
    )

    # -- negative control
    control_cut = None
    ctl = res.get("control")
    w("## Negative control: the same scale-down without the drain\n")
    if ctl:
        crs = ctl["client"].requests()
        cf = failed(crs)
        control_cut = len(cf)
        w(
            "Autoscaling mode Off, decode replicas 2 -> 1 (a plain decrease: the ReplicaSet picks the pod, SIGTERM,"
            f" the engine's own shutdown, terminationGracePeriodSeconds {grace()} s) with {CONTROL_STREAMS} streams"
            " of 800 tokens (40 s at the pace) started 8 s before. Decode gauges just before: "
            f"{ {k: (v or {}).get('vllm:num_requests_running') for k, v in ctl['gauges_before'].items()} }."
        )
        w(f"\n**{len(cf)} of {len(crs)} streams cut** (criterion: >= 1).")
        for r in cf[:8]:
            w(
                f"- id {r['id']}: status {r['status']}, {r['chunks']} chunks, done {r['done']}, finish {r['finish']},"
                f" tokens {r['completion_tokens']}/{r['osl']}, error {r['error']},"
                f" ended {r['end'] - r['start']:.1f} s in"
            )
    else:
        w("Not run.")
    w("")

    # -- decisions
    w("## Decisions (status.autoscaling as watched)\n")
    w("| t | desired P+D | recommended P+D | in band | ScalingLimited | reason |")
    w("|---|---|---|---|---|---|")
    prev = None
    changes_at = []
    band_ok = True
    for e in obs.owner_events:
        a = e.get("autoscaling") or {}
        des = ((a.get("prefill") or {}).get("desiredReplicas"), (a.get("decode") or {}).get("desiredReplicas"))
        if des == prev or des[0] is None or e.get("spec_mode") != "Operator":
            continue
        rec = ((a.get("prefill") or {}).get("recommendedReplicas"), (a.get("decode") or {}).get("recommendedReplicas"))
        lim = next((c for c in e["conditions"] if c["type"] == "ScalingLimited"), None)
        ib = in_band(*des)
        limited = lim and lim["status"] == "True"
        band_ok &= ib or bool(limited)
        w(
            f"| {fmt_t(e['t'], base)} | {des[0]}+{des[1]} | {rec[0]}+{rec[1]} | {'yes' if ib else 'NO'} |"
            f" {(lim['status'] + '/' + str(lim['reason'])) if lim else '-'} | {(a.get('reason') or '')[:160]} |"
        )
        changes_at.append((e["t"], prev, des))
        prev = des
    w(
        f"\nEvery applied pair inside the band [{BAND[0][0]}:{BAND[0][1]}, {BAND[1][0]}:{BAND[1][1]}]"
        " or ScalingLimited:"
        f" {'yes' if band_ok else 'NO'}.\n"
    )
    ready_out = sum(
        1
        for s in obs.timeline
        if s["ready"]["prefill"]
        and s["ready"]["decode"]
        and not in_band(s["ready"]["prefill"], s["ready"]["decode"])
        and base <= s["t"] <= end_main
    )
    w(f"Seconds (1 s samples) where the Ready counts sat outside the band: {ready_out}.\n")

    # -- reaction
    w("## Reaction: load step -> desired change\n")
    w(
        "| Step into | expected P+D | first desired change after the step | seconds | decision intervals |"
        " roles moved in that decision | room at the step |"
    )
    w("|---|---|---|---|---|---|---|")
    ups = []
    for i, row in enumerate(phase_rows[1:], start=1):
        before = phase_rows[i - 1]
        if row["expected"] == before["expected"]:
            continue
        # A role grows at a load step where its own target rises, not where the room only shares the NPUs anew:
        # after E1, C3b's streams leave and prefill gets decode's NPU once decode has shrunk (a scale-down's window).
        grow = [
            r
            for r, x, y, tx, ty in zip(
                ("prefill", "decode"), before["expected"], row["expected"], before["targets"], row["targets"],
                strict=True,
            )
            if y > x and ty > tx
        ]  # fmt: skip
        held = next((b for t, _, b in reversed(changes_at) if t < row["t"]), None)
        # A trade: the node's NPUs were all held at the step and the optimum takes one from the other role, whose
        # scale-down waits for its window like any other (the design's check 5); timed against that window.
        full = held is not None and sum(held) >= NODE_NPUS
        pairs = list(zip(row["expected"], held or row["expected"], strict=True))
        trade = full and any(e < h for e, h in pairs) and any(e > h for e, h in pairs)
        room = "full: a trade" if trade else "full" if full else "free"
        if trade and not grow:  # the room shares the NPUs anew (C3b after E1): timed as a trade all the same
            grow = [r for r, (e, h) in zip(("prefill", "decode"), pairs, strict=True) if e > h]
        # The reaction is the first decision that raises a role the step grows (run 25's C3: decode grew first on
        # G3's streams still in its lanes, prefill a decision later); a step that grows none, its first change.
        raised = [i for i, r in enumerate(("prefill", "decode")) if r in grow]
        nxt = next(
            ((t, a, b) for t, a, b in changes_at
             if t >= row["t"] and a is not None and (not raised or any(b[i] > a[i] for i in raised))),
            None,
        )  # fmt: skip
        if held == row["expected"]:
            # Already the step's optimum (an earlier phase's decision got there): nothing to react to. Timing the
            # next change instead would time the next phase's (run 13's E2: 18.5 intervals, C2's cap).
            w(f"| {row['name']} | {row['expected'][0]}+{row['expected'][1]} | none needed: at it when the step came"
              f" | 0 | 0 | - | {room} |")  # fmt: skip
            if grow:
                ups.append((row["name"], 0.0, grow, list(grow), trade))
            continue
        if not nxt:
            w(f"| {row['name']} | {row['expected'][0]}+{row['expected'][1]} | none | - | - | - | {room} |")
            if grow:
                ups.append((row["name"], None, grow, [], trade))
            continue
        t, a, b = nxt
        moved = [r for r, x, y in zip(("prefill", "decode"), a, b, strict=True) if x != y]
        if grow:
            ups.append((row["name"], (t - row["t"]) / INTERVAL, grow, moved, trade))
        w(
            f"| {row['name']} | {row['expected'][0]}+{row['expected'][1]} | {a[0]}+{a[1]} -> {b[0]}+{b[1]} |"
            f" {t - row['t']:.1f} | {(t - row['t']) / INTERVAL:.1f} | {', '.join(moved)} | {room} |"
        )
    w(
        "\nA scale-down waits for the stabilization window by design; its delay is the window plus the decision, not"
        " a reaction time. A trade (the node full at the step, the optimum taking an NPU from the other role) waits"
        f" for the other role's scale-down, so it is timed against that window plus 2 intervals"
        f" ({TRADE_INTERVALS:.0f} intervals).\n"
    )
    w("Published intervals of peers, beside ours:\n")
    w("| Controller | Interval / windows |")
    w("|---|---|")
    for a, b in PEERS:
        w(f"| {a} | {b} |")
    w("")

    # -- the verdicts, at the top
    def yes(ok: bool | None) -> str:
        return "not measured" if ok is None else ("**met**" if ok else "**NOT met**")

    wrong = [r for r in phase_rows if r["desired"] != r["expected"]]
    unstable = [r for r in phase_rows if max(r["changes"].values()) > 1]

    def named(rows: list[dict]) -> str:
        """The phases, each drawn rarely busy with how rarely (the optimum is the mean rate's)."""
        return ", ".join(
            r["name"] + (f" (drawn busier than {100 - 100 * rare[r['name']]:.1f} % of its draws)" if r["name"] in rare
                         else "")
            for r in rows
        )  # fmt: skip

    growth = [u for u in ups if not u[4]]
    trades = [u for u in ups if u[4]]
    slow = [u for u in growth if u[1] is None or u[1] > 2]
    slow_trades = [u for u in trades if u[1] is None or u[1] > TRADE_INTERVALS]
    both = [u for u in ups if len(u[2]) == 2]

    def timed(steps: list[tuple]) -> str:
        return ", ".join(f"{u[0]}: {'none' if u[1] is None else f'{u[1]:.1f}'}" for u in steps) or "-"

    summary = [
        "## Acceptance (issue 33, Checked by)\n",
        "| Criterion | Measured | Verdict |",
        "|---|---|---|",
        f"| Zero failed requests | {len(all_failed)} of {len(reqs)} failed | {yes(not all_failed)} |",
        f"| >= 2 drained scale-downs per role with requests running at the cordon | decode {qualifying['decode']},"
        f" prefill {qualifying['prefill']} | {yes(min(qualifying.values()) >= 2)} |",
        f"| Negative control cuts >= 1 stream | {control_cut if control_cut is not None else '-'} cut |"
        f" {yes(None if control_cut is None else control_cut >= 1)} |",
        f"| Desired = the pacing optimum at each phase's end | {len(phase_rows) - len(wrong)} of {len(phase_rows)}"
        f"{' (off: ' + named(wrong) + ')' if wrong else ''} | {yes(not wrong)} |",
        f"| Applied pairs inside the band or ScalingLimited | {'all' if band_ok else 'not all'} | {yes(band_ok)} |",
        f"| <= 1 change per role per steady phase (after the step's own) | {len(phase_rows) - len(unstable)} of"
        f" {len(phase_rows)}{' (off: ' + named(unstable) + ')' if unstable else ''} | {yes(not unstable)} |",
        f"| Scale-up reaction <= 2 decision intervals (not a trade) | {timed(growth)} |"
        f" {yes(None if not growth else not slow)} |",
        f"| Scale-up on a full node (a trade) <= the other role's down window + 2 intervals ({TRADE_INTERVALS:.0f})"
        f" | {timed(trades)} | {yes(None if not trades else not slow_trades)} |",
        "| Both roles in one decision when both must grow | "
        + (", ".join(f"{u[0]}: moved {'+'.join(u[3]) or 'nothing'}" for u in both) or "no such step")
        + f" | {yes(None if not both else all(len(u[3]) == 2 for u in both))} |",
        "",
    ]
    out[summary_at:summary_at] = summary
    return "\n".join(out) + "\n"


class _Loaded:
    """The raw logs of a run, read back: analyse() again without running (--analyse DIR)."""

    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)

    def requests(self) -> list[dict]:
        return [x for x in self.lines if x.get("event") == "request"]  # type: ignore[attr-defined]

    def phases(self) -> list[dict]:
        return [x for x in self.lines if x.get("event") == "phase"]  # type: ignore[attr-defined]


def load_raw(raw: Path) -> dict:
    def jl(name: str) -> list[dict]:
        f = raw / name
        return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []

    obs = _Loaded(**{n: jl(f"{n}.jsonl") for n in ("pod_events", "owner_events", "cordons", "timeline")})
    control = None
    if (raw / "control.json").exists():
        control = {
            **json.loads((raw / "control.json").read_text()),
            "client": _Loaded(lines=jl("client-control.jsonl")),
        }
    return {
        "info": json.loads((raw / "info.json").read_text()),
        "main": _Loaded(lines=jl("client-autoscaled.jsonl")),
        "control": control,
        "obs": obs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-build", action="store_true", help="use the images built by an earlier run")
    ap.add_argument("--phases", choices=("decode", "all", "drains"), default="all")
    ap.add_argument("--no-control", action="store_true", help="skip the negative control")
    ap.add_argument("--smoke", action="store_true", help="one 30 s phase, no control: the harness works")
    ap.add_argument("--raw", default=str(REPO / "build" / "bench-autoscale"), help="raw logs (jsonl) go here")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--analyse", metavar="DIR", help="only write the report again from a run's raw logs")
    args = ap.parse_args()
    too_long = [p["name"] for p in DECODE_PHASES + PREFILL_PHASES + DRAIN_PHASES if longest(p) > MAX_SEQ_LEN]
    if too_long and not args.analyse:
        ap.error(f"phases whose longest request exceeds maxSeqLen {MAX_SEQ_LEN}: {too_long}")
    if args.analyse:
        res = load_raw(Path(args.analyse))
    else:
        from atom_localcluster.kind import cleanup_on_signals

        with cleanup_on_signals():  # killed (SIGTERM/SIGHUP), the node and the chart still go in run()'s finally
            res = run(args)
    text = analyse(res)
    Path(args.raw, "report.md").write_text(text)
    if not args.smoke:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
