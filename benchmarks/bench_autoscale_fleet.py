"""The operator's cost with autoscaling on vs off, on the real operator process (``make bench-autoscale-fleet``;
not a test).

N AtomDeployments (decode-only, 4 replicas each) on kwok NPU nodes of the local control plane. Once their pods are
Ready, every pod's IP is patched to a loopback address of its own (as tests/operator/test_autoscale_drain.py does:
kwok sets a pod's IP once, when it turns the pod Running, and leaves it alone after), where one helper process
answers /metrics on port 9090 with an engine's own rendering of a changing load (bench_autoscale_scrape's server).
The same objects are then measured with ``spec.autoscaling.mode`` Off and Operator (intervalSeconds 5, decode
bounds 4..4: the loop scrapes and decides every interval but never changes a replica count, so both modes keep the
same pods), the modes interleaved over rounds because the machine is shared:

- reconcile latency: one spec patch per object every 0.2 s, ``spec.service.port`` set to a value new in this
  round, so the operator rewrites one child (the Service) and no pod is replaced; timed from the patch sent to the
  Service's new port seen on a watch;
- CPU seconds per minute of the operator process (and of the API server and the helper) over a quiet window;
- the operator's audited API writes in that window, by request, and its reconciles;
- in Operator mode, the autoscaler's own scrape histogram and scrape errors from the operator's /metrics.

Writes benchmarks/results/autoscaling-fleet.md.

    .venv/bin/python benchmarks/bench_autoscale_fleet.py [--count 100] [--rounds 2] [--window 60]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from atom_localcluster.cluster import Cluster, atom_node
from atom_localcluster.operator import USER, OperatorProcess
from atom_localcluster.wait import wait_for
from atom_operator.api import GROUP, PLURAL, VERSION
from bench_autoscale_scrape import SERVER, address
from bench_operator import cpu_seconds
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.config import new_client_from_config
from kubernetes.watch import Watch
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "autoscaling-fleet.md"
NAMESPACE = "bench"
PODS = 4  # decode replicas of every AtomDeployment
INTERVAL = 5  # spec.autoscaling.intervalSeconds
PATCH_EVERY = 0.2  # seconds between the latency phase's spec patches
SETTLE = 15.0  # seconds after a mode converged before the quiet window: three decisions of the loop
MERGE = "application/merge-patch+json"
DECODE_PODS = "app.kubernetes.io/component=decode"


# ---- the objects ----------------------------------------------------------------------------------------------
def name(i: int) -> str:
    return f"llm-{i:04d}"


def manifest(i: int) -> dict:
    # min == max == PODS: in Operator mode the loop does all its work (scrape, decide, status) and never scales,
    # so the two modes are measured on the same 4 pods per object.
    autoscaling = {"mode": "Off", "intervalSeconds": INTERVAL, "decode": {"minReplicas": PODS, "maxReplicas": PODS}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AtomDeployment",
        "metadata": {"name": name(i), "namespace": NAMESPACE},
        "spec": {"model": {"source": "builtin:tiny"}, "decode": {"replicas": PODS, "npusPerReplica": 1},
                 "service": {"port": 8000}, "autoscaling": autoscaling},
    }  # fmt: skip


def clients(cluster: Cluster) -> tuple[CustomObjectsApi, CoreV1Api]:
    client = new_client_from_config(str(cluster.kubeconfig))
    return CustomObjectsApi(client), CoreV1Api(client)


def on_all(n: int, send) -> None:  # noqa: ANN001
    """``send(i)`` for every object from 8 threads: one client alone would pace the patches by its round trips."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(send, range(n)))


def create_fleet(objects: CustomObjectsApi, n: int) -> None:
    on_all(n, lambda i: objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, manifest(i),
                                                                _request_timeout=120))  # fmt: skip


def list_objects(objects: CustomObjectsApi) -> list[dict]:
    return objects.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]


def conditions(obj: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


def all_ready(objects: CustomObjectsApi, n: int) -> bool:
    items = list_objects(objects)
    return len(items) == n and all(conditions(o).get("Ready") == "True" for o in items)


# ---- the pods on loopback -------------------------------------------------------------------------------------
def decode_pods(core: CoreV1Api) -> list[dict]:
    """The decode pods as JSON (the typed client's models are slow to build for hundreds of pods)."""
    response = core.list_namespaced_pod(NAMESPACE, label_selector=DECODE_PODS, _preload_content=False)
    items = json.loads(response.data)["items"]
    return sorted((p for p in items if not p["metadata"].get("deletionTimestamp")),
                  key=lambda p: p["metadata"]["name"])  # fmt: skip


def pod_ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])


def point_pods_at_loopback(core: CoreV1Api, pods: list[dict]) -> None:
    """Pod i's IP becomes address(i), where the helper answers for it. The status patch of
    atom_localcluster.routing.stack.set_pod_ip, sent by the client instead of a kubectl per pod (400 processes)."""

    def patch(i: int) -> None:
        ip = address(i)
        body = {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}
        core.patch_namespaced_pod_status(pods[i]["metadata"]["name"], NAMESPACE, body, _content_type=MERGE)

    on_all(len(pods), patch)


def pods_on_loopback(core: CoreV1Api) -> int:
    return sum((p.get("status") or {}).get("podIP", "").startswith("127.") for p in decode_pods(core))


def start_metrics_server(pods: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(pods)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":
        server.kill()
        raise RuntimeError("the metrics server did not come up (is port 9090 of 127.78.x.y taken?)")
    return server


# ---- modes ------------------------------------------------------------------------------------------------------
def set_mode(objects: CustomObjectsApi, n: int, mode: str) -> None:
    body = {"spec": {"autoscaling": {"mode": mode}}}
    on_all(n, lambda i: objects.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name(i), body))


def converged(objects: CustomObjectsApi, n: int, mode: str) -> bool:
    """Every object's status is of its current spec, with HPA's conditions exactly while the loop runs for it."""
    items = list_objects(objects)
    current = all((o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"] for o in items)
    scaling = [("ScalingActive" in conditions(o)) == (mode == "Operator") for o in items]
    return len(items) == n and current and all(scaling)


# ---- what is measured -------------------------------------------------------------------------------------------
def operator_samples(op: OperatorProcess) -> dict[tuple[str, tuple], float]:
    """The operator's /metrics as {(sample name, sorted labels): value}."""
    out = {}
    for family in text_string_to_metric_families(op.metrics()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def delta(before: dict, after: dict, sample: str, **labels: str) -> float:
    """How much the samples of that name (and labels) grew over the window."""
    keys = [k for k in after if k[0] == sample and set(labels.items()) <= set(k[1])]
    return sum(after[k] - before.get(k, 0.0) for k in keys)


def histogram_quantile(q: float, before: dict, after: dict, histogram: str) -> float:
    """Prometheus' histogram_quantile over the window's observations (linear within the bucket)."""
    buckets = sorted((float(dict(k[1])["le"]), after[k] - before.get(k, 0.0))
                     for k in after if k[0] == f"{histogram}_bucket")  # fmt: skip
    if not buckets or buckets[-1][1] == 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower  # beyond the largest bucket: its bound is all the histogram knows
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


def stamp(event: dict) -> float:
    return dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()


def operator_writes(writes: list[dict], began: float, ended: float) -> dict[str, int]:
    """The operator's writes received in [began, ended) (wall clock), by verb and resource."""
    out: dict[str, int] = {}
    for w in writes:
        if w["user"]["username"] != USER or not began <= stamp(w) < ended:
            continue
        ref = w.get("objectRef") or {}
        request = f'{w["verb"]} {ref.get("resource")}' + (f'/{ref["subresource"]}' if ref.get("subresource") else "")
        code = (w.get("responseStatus") or {}).get("code") or 0
        if code >= 300:  # refused (a 409: a write guarded by a resourceVersion that had moved)
            request += f" {code}"
        out[request] = out.get(request, 0) + 1
    return out


class ServiceWatch(threading.Thread):
    """Stamps (monotonic) when each Service is first seen with each port: a port is new in every round, so the
    first sighting of (service, port) is the operator's rewrite of that round."""

    def __init__(self, core: CoreV1Api) -> None:
        super().__init__(daemon=True)
        self.core, self.watch, self.stopped = core, Watch(), False
        self.seen: dict[tuple[str, int], float] = {}

    def run(self) -> None:
        # As bench_operator's ReadyWatch: when the watch ends (closed, or its version compacted) a list gives the
        # present state and a version to go on from; a change seen only by that list is stamped late, never early.
        version = None
        while not self.stopped:
            try:
                if version is None:
                    listing = self.core.list_namespaced_service(NAMESPACE)
                    for service in listing.items:
                        self._stamp(service)
                    version = listing.metadata.resource_version
                for event in self.watch.stream(self.core.list_namespaced_service, NAMESPACE,
                                               resource_version=version, allow_watch_bookmarks=True):  # fmt: skip
                    if event["type"] != "BOOKMARK":
                        self._stamp(event["object"])
                    version = self.watch.resource_version or version
            except Exception as e:
                if self.stopped:
                    return
                print(f"service-watch: {type(e).__name__}: {e}; listing again", file=sys.stderr, flush=True)
                version = None
                time.sleep(1)

    def _stamp(self, service) -> None:  # noqa: ANN001 - a V1Service
        for port in service.spec.ports or []:
            self.seen.setdefault((service.metadata.name, port.port), time.monotonic())

    def stop(self) -> None:
        self.stopped = True
        self.watch.stop()


def reconcile_latencies(objects: CustomObjectsApi, services: ServiceWatch, n: int, port: int) -> list[float]:
    """Patch every object's service port to ``port``, one every PATCH_EVERY s; seconds from each patch sent to its
    Service seen with the port (objects whose Service never showed it within 120 s are left out)."""
    sent: dict[str, float] = {}
    start = time.monotonic()
    for i in range(n):
        time.sleep(max(0.0, start + i * PATCH_EVERY - time.monotonic()))
        sent[name(i)] = time.monotonic()
        objects.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name(i),
                                               {"spec": {"service": {"port": port}}})  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all((k, port) in services.seen for k in sent):
        time.sleep(0.5)
    return [services.seen[(k, port)] - t for k, t in sent.items() if (k, port) in services.seen]


@dataclass
class Round:
    mode: str
    latencies: list[float] = field(default_factory=list)
    operator_cpu: float = 0.0  # CPU seconds per minute
    apiserver_cpu: float = 0.0
    helper_cpu: float = 0.0
    writes: dict[str, int] = field(default_factory=dict)  # per minute, by request
    reconciles: float = 0.0  # per minute
    scrape_rounds: float = 0.0  # one deployment's scrape, per minute
    scrape_p99: float = math.nan
    scrape_mean: float = math.nan
    scrape_errors: float = 0.0
    on_loopback: int = 0
    load: str = ""


def quiet_window(r: Round, op: OperatorProcess, cluster: Cluster, helper: subprocess.Popen, seconds: float) -> None:
    """CPU, writes and the operator's own counters over ``seconds`` in which nothing but the mode's work happens."""
    pids = {"operator": op.proc.pid, "apiserver": cluster.component("kube-apiserver").proc.pid, "helper": helper.pid}
    metrics = operator_samples(op)
    cpu = {k: cpu_seconds(p) for k, p in pids.items()}
    began = time.time()
    time.sleep(seconds)
    ended = time.time()
    cpu = {k: (cpu_seconds(p) - cpu[k]) * 60 / seconds for k, p in pids.items()}
    after = operator_samples(op)
    r.load = Path("/proc/loadavg").read_text().split()[0]
    time.sleep(2)  # writes received inside the window but audited after it
    per_minute = 60 / seconds
    r.writes = {k: round(v * per_minute) for k, v in operator_writes(cluster.write_requests(), began, ended).items()}
    r.operator_cpu, r.apiserver_cpu, r.helper_cpu = cpu["operator"], cpu["apiserver"], cpu["helper"]
    r.reconciles = delta(metrics, after, "atom_operator_reconciles_total") * per_minute
    scrapes = "atom_autoscaler_scrape_seconds"
    r.scrape_rounds = delta(metrics, after, f"{scrapes}_count") * per_minute
    r.scrape_p99 = histogram_quantile(0.99, metrics, after, scrapes)
    count = delta(metrics, after, f"{scrapes}_count")
    r.scrape_mean = delta(metrics, after, f"{scrapes}_sum") / count if count else math.nan
    r.scrape_errors = delta(metrics, after, "atom_autoscaler_scrape_errors_total")


# ---- the report -------------------------------------------------------------------------------------------------
def pct(values: list[float], q: int) -> float:
    if not values:
        return math.nan
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def round_row(k: int, r: Round, n: int) -> str:
    writes = sum(r.writes.values())
    top = ", ".join(f"{req} {v}" for req, v in sorted(r.writes.items(), key=lambda kv: -kv[1])[:3]) or "none"
    scrape = f"{ms(r.scrape_p99)} / {ms(r.scrape_mean)}" if r.mode == "Operator" else "-"
    errors = f"{r.scrape_errors:.0f}" if r.mode == "Operator" else "-"
    return (f"| {k} | {r.mode} | {len(r.latencies)}/{n} | {ms(pct(r.latencies, 50))} / {ms(pct(r.latencies, 99))}"
            f" / {ms(max(r.latencies, default=math.nan))} | {r.operator_cpu:.2f} | {r.apiserver_cpu:.2f}"
            f" | {r.helper_cpu:.2f} | {writes} ({top}) | {r.reconciles:.0f} | {r.scrape_rounds:.0f} | {scrape}"
            f" | {errors} | {r.on_loopback} | {r.load} |")  # fmt: skip


def medians(rounds: list[Round], mode: str) -> dict[str, float]:
    mine = [r for r in rounds if r.mode == mode]
    return {
        "p50": statistics.median(pct(r.latencies, 50) for r in mine),
        "p99": statistics.median(pct(r.latencies, 99) for r in mine),
        "max": statistics.median(max(r.latencies, default=math.nan) for r in mine),
        "operator CPU": statistics.median(r.operator_cpu for r in mine),
        "apiserver CPU": statistics.median(r.apiserver_cpu for r in mine),
        "writes": statistics.median(sum(r.writes.values()) for r in mine),
        "reconciles": statistics.median(r.reconciles for r in mine),
    }


def report(rounds: list[Round], args: argparse.Namespace, nodes: int, took: float) -> str:
    n = args.count
    off, on = medians(rounds, "Off"), medians(rounds, "Operator")
    ratio = lambda k: f"{on[k] / off[k]:.2f}" if off[k] else "-"
    scrape = [r for r in rounds if r.mode == "Operator"]
    lines = [
        "# Autoscaling: the operator's cost with autoscaling on vs off (`make bench-autoscale-fleet`)",
        "",
        f"`bench_autoscale_fleet.py --count {n} --rounds {args.rounds} --window {args.window:g}`"
        f" ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {took / 60:.0f} min). The real operator process on the"
        f" local control plane with {nodes} kwok NPU nodes: {n} AtomDeployments, decode only, {PODS} replicas each"
        f" ({n * PODS} pods). Every pod's IP is patched to a loopback address of its own where one helper process"
        " answers /metrics on port 9090 with an engine's own rendering of a changing load, so the autoscaler"
        " scrapes real engine metrics over HTTP. The same objects run `spec.autoscaling.mode: Off` and `Operator`"
        f" (intervalSeconds {INTERVAL}, decode bounds {PODS}..{PODS}: it scrapes, decides and keeps its status every"
        " interval, and never scales), interleaved; Off keeps the rest of the autoscaling block.",
        "",
        f"Per round, after the mode converged and {SETTLE:.0f} s more: a {args.window:g} s quiet window (CPU"
        " seconds per minute from /proc of the operator, the API server and the helper; the operator's audited"
        " writes per minute; its reconciles and, in Operator mode, its `atom_autoscaler_scrape_seconds` p99"
        " (from histogram buckets) and mean, and `atom_autoscaler_scrape_errors_total`), then the reconcile"
        f" latency: one spec patch per object every {PATCH_EVERY:g} s (`spec.service.port`, new each round: the"
        " operator rewrites the Service, no pod is replaced), from the patch sent to the Service's new port seen"
        " on a watch. A shared 2-core machine: the control plane, the helper and this script share the cores"
        " with the operator (and with other tenants), so figures move by tens of percent between rounds.",
        "",
        "| round | mode | Services seen | reconcile latency p50 / p99 / max (ms) | operator CPU s/min"
        " | API server CPU s/min | helper CPU s/min | operator writes/min (top requests) | reconciles/min"
        " | deployment scrapes/min | scrape p99 / mean (ms) | scrape errors | pods on loopback | load avg |",
        "|---|---|---|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|",
        *(round_row(k + 1, r, n) for k, r in enumerate(rounds)),
        "",
        "Medians over the rounds of each mode, and Operator / Off:",
        "",
        "| figure | Off | Operator | Operator / Off |",
        "|---|---:|---:|---:|",
        *(f"| reconcile latency {k} | {ms(off[k])} ms | {ms(on[k])} ms | {ratio(k)} |" for k in ("p50", "p99", "max")),
        *(f"| {k} | {off[k]:.2f} s/min | {on[k]:.2f} s/min | {ratio(k)} |" for k in ("operator CPU", "apiserver CPU")),
        f"| operator writes | {off['writes']:.0f}/min | {on['writes']:.0f}/min | - |",
        f"| reconciles | {off['reconciles']:.0f}/min | {on['reconciles']:.0f}/min | - |",
        f"| scrape p99 (one deployment's {PODS} pods) | - |"
        f" {ms(statistics.median(r.scrape_p99 for r in scrape))} ms | - |",
        f"| scrape errors | - | {sum(r.scrape_errors for r in scrape):.0f} in all | - |",
        "",
    ]
    return "\n".join(lines)


# ---- the run ----------------------------------------------------------------------------------------------------
def every_pod_ready(core: CoreV1Api, n: int) -> list[dict] | None:
    pods = decode_pods(core)
    return pods if len(pods) == n * PODS and all(pod_ready(p) for p in pods) else None


def prepare(cluster: Cluster, n: int) -> subprocess.Popen:
    """The fleet created, Ready, and its pods answering on loopback; returns the helper process."""
    objects, core = clients(cluster)
    create_fleet(objects, n)
    wait_for(lambda: all_ready(objects, n), f"{n} AtomDeployments Ready", timeout=600, interval=2)
    pods = wait_for(lambda: every_pod_ready(core, n), f"{n * PODS} decode pods Ready", timeout=300, interval=2)
    helper = start_metrics_server(n * PODS)
    point_pods_at_loopback(core, pods)
    return helper


def measure(cluster: Cluster, op: OperatorProcess, helper: subprocess.Popen, args: argparse.Namespace) -> list[Round]:
    objects, core = clients(cluster)
    services = ServiceWatch(clients(cluster)[1])  # its own connection: a watch holds one open
    services.start()
    rounds = []
    for k, mode in enumerate(["Off", "Operator"] * args.rounds):
        r = Round(mode)
        began = time.monotonic()
        set_mode(objects, args.count, mode)
        wait_for(lambda m=mode: converged(objects, args.count, m), f"mode {mode} converged", timeout=300,
                 interval=2)  # fmt: skip
        print(f"round {k + 1}: {mode} converged in {time.monotonic() - began:.0f} s", flush=True)
        time.sleep(SETTLE)
        quiet_window(r, op, cluster, helper, args.window)
        r.latencies = reconcile_latencies(objects, services, args.count, 8100 + k)
        r.on_loopback = pods_on_loopback(core)
        print(round_row(k + 1, r, args.count), flush=True)
        rounds.append(r)
    services.stop()
    return rounds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100, help="AtomDeployments (4 decode pods each)")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of rounds (Off, Operator)")
    ap.add_argument("--window", type=float, default=60, help="seconds of the quiet window")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    started = time.monotonic()
    # Each pod takes 1 CPU of a fake node's 64 (operator/atom_operator/sizing.py) and one of its NPUs: 60 a node.
    nodes = [atom_node(f"atom-f{i}", 100) for i in range(args.count * PODS // 60 + 1)]
    work = Path(tempfile.mkdtemp(prefix="atom-bench-fleet-"))
    with Cluster(nodes=nodes) as cluster:
        from atom_operator.api.crd import render

        cluster.kubectl("apply", "-f", "-", input=render())
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=180s", "crd/atomdeployments.serving.atom.dev")
        cluster.kubectl("create", "namespace", NAMESPACE)
        op = OperatorProcess(cluster, work)
        op.start()  # its webhook server listens but is not registered: the CRD alone admits
        helper = None
        try:
            helper = prepare(cluster, args.count)
            rounds = measure(cluster, op, helper, args)
        finally:
            if helper is not None:
                helper.kill()
                helper.wait()
            op.stop()
    text = report(rounds, args, len(nodes), time.monotonic() - started)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
