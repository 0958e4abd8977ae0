"""Prefix-aware routing across decode replicas (``make bench-routing``; not a test).

Two decode replicas of SmolLM2-135M (an AtomDeployment on the local control plane, its engines run as the pod
specs say on loopback addresses, see atom_localcluster/routing/stack.py) behind Envoy, three ways:

  epp     Envoy asking the Gateway API Inference Extension's endpoint picker (v1.5.0: prefix, queue and KV-usage
          scorers) through ext_proc, the pool being the InferencePool the operator made;
  random  Envoy picking a replica at random per request (what the plain ClusterIP Service does);
  lwepp   Envoy asking GIE v1.6.0's lightweight endpoint picker, round robin over the pool (cache-blind).

Each run starts fresh engines (empty caches) and a fresh router, warms up with one request per prefix, then
measures the prefix hit rate (from the engines' /metrics) and TTFT at the client
(atom_localcluster/routing/workload.py).
Runs are interleaved (epp, random, lwepp, epp, ...) and each figure is the median over the repeats. Results go to
benchmarks/results/routing.md.

    .venv/bin/python benchmarks/bench_routing.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from atom_localcluster.cluster import Cluster
from atom_localcluster.operator import OperatorProcess
from atom_localcluster.routing import scenario
from atom_localcluster.routing.workload import Result, Workload

REPO = Path(__file__).resolve().parents[1]

NAMESPACE = "bench-routing"
NAME = "smollm2"
RESULTS = REPO / "benchmarks" / "results" / "routing.md"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    w = Workload()
    lanes, kv_blocks = scenario.SIZING
    results: dict[str, list[Result]] = {r: [] for r in scenario.ROUTERS}
    loads: list[float] = []  # the 1-minute load average as each run ends: the machine is shared
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="atom-bench-routing-") as tmp, Cluster() as cluster:
        work = Path(tmp)
        (work / "operator-work").mkdir()
        op = OperatorProcess(cluster, work / "operator-work")
        scenario.install_crds(cluster)
        op.start()
        try:
            cluster.kubectl("create", "namespace", NAMESPACE)
            scenario.deploy(cluster, NAMESPACE, NAME)
            for i in range(args.repeats):
                for router in scenario.ROUTERS:
                    r = scenario.one_run(router, cluster, NAMESPACE, NAME, w, work, f"{router}{i}")
                    results[router].append(r)
                    loads.append(os.getloadavg()[0])
                    print(f"round {i + 1} {router:6}: hit rate {r.hit_rate:.3f}, TTFT p50 {r.ttft_p50 * 1e3:.0f} ms"
                          f" p90 {r.ttft_p90 * 1e3:.0f} ms, requests per pod {r.requests_per_pod},"
                          f" load average {loads[-1]:.1f}", flush=True)
        finally:
            op.stop()
    write(results, w, lanes, kv_blocks, time.monotonic() - started, loads)
    return 0


def write(results: dict[str, list[Result]], w: Workload, lanes: int, kv_blocks: int, seconds: float,
          loads: list[float]) -> None:
    med = {r: {k: statistics.median(getattr(x, k) for x in xs) for k in ("hit_rate", "ttft_p50", "ttft_p90")}
           for r, xs in results.items()}
    base = med["random"]
    lines = [
        "# Prefix-aware routing benchmark (make bench-routing)",
        "",
        f"Two decode replicas of {scenario.MODEL} (cpu backend, lanes={lanes}, kvBlocks={kv_blocks}, maxSeqLen 512,"
        f" prefix cache on) behind Envoy 1.40.0; {w.groups} shared prefixes of {w.prefix_words} words (about"
        f" {int(w.prefix_words * 1.3)} tokens) each followed by a question of its own, {w.rounds - 1} measured"
        f" rounds visiting every prefix once in a seeded random order after one warm-up round, {w.max_tokens}"
        f" output tokens, {w.concurrency} concurrent clients, fresh engines and router per run; median of"
        f" {len(results['epp'])} interleaved runs. {os.cpu_count()} CPUs ({platform.machine()}), 1 torch thread"
        f" per engine, load average {min(loads):.1f} to {max(loads):.1f} as the runs ended (median"
        f" {statistics.median(loads):.1f}), {seconds / 60:.0f} min in all.",
        "",
        "| router | prefix hit rate | TTFT p50 ms | TTFT p90 ms | p90 vs random | hit rate per run"
        " | TTFT p90 ms per run | requests per pod per run |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    names = {"epp": "Envoy + GIE EPP v1.5.0 (prefix-aware)", "random": "Envoy, random pick (a Service)",
             "lwepp": "Envoy + GIE lwepp v1.6.0 (round robin)"}
    for r, xs in results.items():
        m = med[r]
        lines.append(f"| {names[r]} | {m['hit_rate']:.3f} | {m['ttft_p50'] * 1e3:.0f} | {m['ttft_p90'] * 1e3:.0f} |"
                     f" {base['ttft_p90'] / m['ttft_p90']:.2f}x | {', '.join(f'{x.hit_rate:.3f}' for x in xs)} |"
                     f" {', '.join(f'{x.ttft_p90 * 1e3:.0f}' for x in xs)} |"
                     f" {', '.join('/'.join(map(str, x.requests_per_pod)) for x in xs)} |")
    e = med["epp"]
    speedup = base["ttft_p90"] / e["ttft_p90"]
    lines += [
        "",
        f"Goals (issue 22): hit rate >= 0.8: {e['hit_rate']:.3f} ({'met' if e['hit_rate'] >= 0.8 else 'NOT met'});"
        f" >= 0.3 above random: +{e['hit_rate'] - base['hit_rate']:.3f}"
        f" ({'met' if e['hit_rate'] - base['hit_rate'] >= 0.3 else 'NOT met'}); TTFT p90 >= 1.5x better than"
        f" random: {speedup:.2f}x ({'met' if speedup >= 1.5 else 'NOT met'}).",
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
