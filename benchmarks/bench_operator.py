"""Operator benchmark on the local control plane (``make bench-operator``; not a test).

Creates N AtomDeployments (a mix of decode-only and decode+rngd-prefill) on enough kwok NPU nodes, then reports:
time from each object's create request to its Ready status (p50/p99, and until all are Ready), time from create
to its last child written (p50/p99), the operator's API writes during an idle window after convergence (goal:
zero) and the operator's peak RSS. Results go to benchmarks/results/operator.md, one section per creation mode.

How the objects are created decides what "create -> last child written" means:
  --rate 0 (default)  all N as fast as the client can send them (8 connections). Most objects then wait in the
                      operator's queue behind the others, so the per-object figure is mostly queueing: it measures
                      throughput (about N/2 divided by the objects reconciled per second), not reaction time.
  --rate R            one create every 1/R s, the way a client or CI system would, so the figure is the time
                      the operator takes to react to one object while the cluster is busy with all the others.
Both modes report the same metrics; nothing else differs. ``make bench-operator`` runs --rate 10 (500 objects in
50 s, the run that checks issue 7's goals) and then all at once (the throughput of this control plane).

    .venv/bin/python benchmarks/bench_operator.py [--count 500] [--idle 300] [--rate 0]
"""

from __future__ import annotations

import argparse
import bisect
import concurrent.futures
import datetime as dt
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from atom_localcluster.cluster import Cluster, atom_node, rngd_node
from atom_localcluster.operator import USER, OperatorProcess
from atom_operator.api import GROUP, PLURAL, VERSION
from kubernetes.client import CustomObjectsApi
from kubernetes.config import new_client_from_config
from kubernetes.watch import Watch

REPO = Path(__file__).resolve().parents[1]

NAMESPACE = "bench"


def manifest(i: int) -> dict:
    spec: dict = {"model": {"source": "builtin:tiny"}, "decode": {"replicas": 1, "npusPerReplica": 1}}
    if i % 3 == 0:  # a third run remote-only PD with a prefill worker on RNGD
        spec["decode"].update(localPrefill=False)
        spec["prefill"] = {"replicas": 1, "backend": "rngd", "npusPerReplica": 1}
    return {
        "apiVersion": "serving.atom.dev/v1alpha1",
        "kind": "AtomDeployment",
        "metadata": {"name": f"llm-{i:04d}", "namespace": NAMESPACE},
        "spec": spec,
    }


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def api(cluster: Cluster) -> CustomObjectsApi:
    """The AtomDeployments' API as the cluster's admin (its kubeconfig), on one client of the kept library."""
    return CustomObjectsApi(new_client_from_config(str(cluster.kubeconfig)))


class ReadyWatch(threading.Thread):
    """Streams the AtomDeployments' watch events and stamps when each first reports Ready."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.ready: dict[str, float] = {}
        self.api, self.watch, self.stopped = api(cluster), Watch(), False

    def run(self) -> None:
        # The watch can end under load: the server closes it, or the history it resumes from was compacted (410,
        # which Watch retries once and then raises). A list then gives the present state and a version to watch
        # from again, so no Ready is lost; one seen only by that list is stamped when the list returns (late, never
        # early). Before the kubernetes client, `kubectl get -w` did the same.
        version = None
        while not self.stopped:
            try:
                if version is None:
                    listing = self.api.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
                    for obj in listing["items"]:
                        self._stamp(obj)
                    version = listing["metadata"]["resourceVersion"]
                for event in self.watch.stream(self.api.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE,
                                               PLURAL, resource_version=version, allow_watch_bookmarks=True):
                    if event["type"] != "BOOKMARK":
                        self._stamp(event["object"])
                    version = self.watch.resource_version or version
            except Exception as e:
                if self.stopped:  # after stop() the cluster goes away under the open watch
                    return
                print(f"ready-watch: {type(e).__name__}: {e}; listing again", file=sys.stderr, flush=True)
                version = None
                time.sleep(1)

    def _stamp(self, obj: dict) -> None:
        conds = (obj.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
            self.ready.setdefault(obj["metadata"]["name"], time.time())

    def stop(self) -> None:
        self.stopped = True
        self.watch.stop()


def create_all(cluster: Cluster, n: int, rate: float) -> None:
    """Create the N objects as the admin from 8 threads over kept-alive connections; with ``rate``, object i goes
    at i/rate s.

    Not ``kubectl apply``: it sends a GET before every create and starts a process per batch, which on a busy
    2-core machine made the client itself the slowest part (32-156 s for 500 creates)."""
    client = api(cluster)
    start = time.monotonic()

    def send(i: int) -> None:
        if rate:
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
        client.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, manifest(i), _request_timeout=120)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(send, range(n)))


def write_section(path: Path, title: str, text: str) -> None:
    """Replace this mode's section of the results file in place (or add it at the end); keep the others."""
    old = path.read_text() if path.exists() else "# Operator benchmark\n"
    head, *sections = re.split(r"^(?=## )", old, flags=re.M)
    section = f"## {title}\n\n{text}"
    merged = [section if x.startswith(f"## {title}\n") else x for x in sections]
    if section not in merged:
        merged.append(section)
    path.write_text(head.rstrip() + "\n\n" + "".join(f"{x.rstrip()}\n\n" for x in merged))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--idle", type=float, default=300, help="seconds of idle after convergence to count writes")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--rate", type=float, default=0, help="creates per second; 0: all at once (see above)")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/operator.md"))
    args = ap.parse_args()
    n = args.count
    # Each engine pod requests 1 CPU (operator/atom_operator/sizing.py) of a fake node's 64 and one of its 110 pods:
    # enough nodes that every pod fits, so Ready measures the operator and Kubernetes, not a full cluster.
    per_node = 60
    atom_nodes = [atom_node(f"atom-b{i}", 100) for i in range(n // per_node + 1)]
    rngd_nodes = [rngd_node(f"rngd-b{i}", 100) for i in range(n // 3 // per_node + 1)]
    work = Path(tempfile.mkdtemp(prefix="atom-bench-"))
    with Cluster(nodes=[*atom_nodes, *rngd_nodes]) as cluster:
        from atom_operator.api.crd import render

        cluster.kubectl("apply", "-f", "-", input=render())
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=180s", "crd/atomdeployments.serving.atom.dev")
        cluster.kubectl("create", "namespace", NAMESPACE)
        op = OperatorProcess(cluster, work)
        op.start()  # its webhook server listens but is not registered: the CRD alone admits
        watch = ReadyWatch(cluster)
        watch.start()
        started = time.time()
        create_all(cluster, n, args.rate)
        applied = time.time()
        while len(watch.ready) < n and time.time() - started < args.timeout:
            time.sleep(1)
        all_ready = time.time()
        converged = len(watch.ready)
        # Per object: its create request (audit, microseconds) -> first Ready seen, and -> its last child written.
        writes = cluster.write_requests()
        created, first_write, last_child = {}, {}, {}
        by_request: dict[str, int] = {}
        for w in writes:
            ref = w.get("objectRef") or {}
            if ref.get("namespace") != NAMESPACE:
                continue
            t = ts(w["requestReceivedTimestamp"])
            if ref.get("resource") == "atomdeployments" and w["verb"] == "create":
                created[ref["name"]] = t
                continue
            if w["user"]["username"] != USER:
                continue
            sub = f'/{ref["subresource"]}' if ref.get("subresource") else ""
            request = f'{w["verb"]} {ref.get("resource")}{sub}'
            by_request[request] = by_request.get(request, 0) + 1
            if ref.get("resource") in ("configmaps", "services", "deployments"):
                owner = ref["name"].removesuffix("-decode-config").removesuffix("-prefill-config")
                owner = owner.removesuffix("-decode").removesuffix("-prefill")
                # Children are written once each in this run (nothing edits them), so the latest is the last one.
                last_child[owner] = max(last_child.get(owner, t), t)
                first_write[owner] = min(first_write.get(owner, t), t)
        to_ready = [watch.ready[k] - created[k] for k in watch.ready if k in created]
        to_children = [last_child[k] - created[k] for k in last_child if k in created]
        to_first_child = [first_write[k] - created[k] for k in first_write if k in created]
        children_to_ready = [watch.ready[k] - last_child[k] for k in watch.ready if k in last_child]
        # The Kubernetes side of Ready: the deployment controller's writes. Its client throttle (kube-controller-
        # manager --kube-api-qps, 20/s by default, 200/s in the harness) capped all-Ready when it was the default;
        # the busiest 10 s shows whether it ran at a cap.
        dc = [
            ts(w["requestReceivedTimestamp"])
            for w in writes
            if w["user"]["username"].endswith(":deployment-controller")
        ]
        dc.sort()
        dc_peak = max((bisect.bisect_left(dc, t + 10) - i for i, t in enumerate(dc)), default=0) / 10
        op_cpu = cpu_seconds(op.proc.pid)
        load, cpus = Path("/proc/loadavg").read_text().split()[0], os.cpu_count()
        # Idle: nothing changes; count every write the operator sends during the window.
        time.sleep(10)
        before = len([w for w in cluster.write_requests() if w["user"]["username"] == USER])
        time.sleep(args.idle)
        idle_writes = len([w for w in cluster.write_requests() if w["user"]["username"] == USER]) - before
        peak = rss_peak_mb(op.proc.pid)
        watch.stop()
        op.stop()
    rows = [
        ("AtomDeployments (1/3 with an RNGD prefill worker)", f"{n}"),
        ("Ready", f"{converged}/{n}"),
        (
            "creates sent" + (f" ({args.rate:g}/s)" if args.rate else " (all at once, 8 connections)"),
            f"{applied - started:.1f} s",
        ),
        ("first create -> all Ready", f"{all_ready - started:.1f} s"),
        ("create -> Ready, p50 / p99 per object", f"{pct(to_ready, 50):.2f} s / {pct(to_ready, 99):.2f} s"),
        ("create -> first child written, p50 / p99",
         f"{pct(to_first_child, 50):.2f} s / {pct(to_first_child, 99):.2f} s"),
        ("create -> last child written, p50 / p99", f"{pct(to_children, 50):.2f} s / {pct(to_children, 99):.2f} s"),
        (
            "last child written -> Ready (Kubernetes' controllers), p50 / p99",
            f"{pct(children_to_ready, 50):.2f} s / {pct(children_to_ready, 99):.2f} s",
        ),
        ("deployment-controller writes, total / busiest 10 s", f"{len(dc)} / {dc_peak:.1f} per s"),
        ("operator CPU until all Ready", f"{op_cpu:.1f} s"),
        ("operator writes until idle, by request",
         ", ".join(f"{k} {v}" for k, v in sorted(by_request.items(), key=lambda kv: -kv[1]))),
        (f"operator writes during {args.idle:.0f} s idle", f"{idle_writes}"),
        ("operator peak RSS", f"{peak:.0f} MB"),
    ]
    table = "| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    mode = f"Created at {args.rate:g}/s" if args.rate else "Created all at once"
    text = (
        f"`bench_operator.py --count {n} --idle {args.idle:g} --rate {args.rate:g}` ({dt.date.today()}, local "
        f"control plane with kwok nodes: {len(atom_nodes)} ATOM, {len(rngd_nodes)} RNGD; {cpus} cores, load "
        f"average {load} when all were Ready).\n\n{table}\n\n"
        "Goals (issue 7): all 500 Ready within 120 s; create -> all children p50 <= 0.5 s; zero idle writes; "
        "peak RSS under 150 MB.\n"
    )
    write_section(Path(args.out), mode, text)
    print(f"## {mode}\n\n{text}")
    return 0 if converged == n else 1


if __name__ == "__main__":
    sys.exit(main())
