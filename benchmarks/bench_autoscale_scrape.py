"""The autoscaler's own cost at fleet scale: 100 autoscaled deployments x 4 pods, scraped and decided every 5 s.

The pods are one server process on 400 loopback addresses (127.78.<i>.<j>:9090), each answering /metrics with an
engine's own rendering (its metrics table) of a changing load; this process runs the operator's scrape, observe and
decide for every deployment per round, as the loop does. Reported: the round's wall time (p50, p99 over rounds), one
deployment's scrape, and
the CPU seconds this process spent per round, measured against an idle baseline round of the same length. The
reconciler's own latency is bench-operator's; this is only what autoscaling adds. Writes
benchmarks/results/autoscaling-scrape.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from atom_operator.api import AtomDeploymentSpec
from atom_operator.autoscale import observe
from atom_operator.autoscale.decision import State, decide
from atom_operator.autoscale.policy import policy
from atom_operator.autoscale.scrape import CONCURRENCY, scrape

OUT = Path(__file__).parent / "results" / "autoscaling-scrape.md"
DEPLOYMENTS, PODS, PERIOD, PORT = 100, 4, 5.0, 9090

SERVER = """
import asyncio, random, sys
from aiohttp import web
from atom_engine.server.metrics import ServerMetrics
from atom_engine.stats import BatcherStats, InFlightStats
n = int(sys.argv[1])
async def main():
    for i in range(n):
        counters = {"arrived": 0}
        def stats(c=counters):
            c["arrived"] += random.randint(0, 5)
            return [BatcherStats(running=random.randint(0, 4), waiting=random.randint(0, 2), idle=0,
                                 arrived_requests=c["arrived"], arrived_prompt_tokens=200 * c["arrived"]),
                    InFlightStats(requests_in_flight=1)]
        m = ServerMetrics("m", stats)
        app = web.Application()
        app.router.add_get("/metrics", lambda _r, m=m: web.Response(body=m.render()))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, f"127.78.{i // 200 + 1}.{i % 200 + 2}", PORT).start()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
""".replace("PORT", str(PORT))


def address(i: int) -> str:
    return f"127.78.{i // 200 + 1}.{i % 200 + 2}"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def rounds(count: int, work: bool) -> tuple[list[float], float]:
    spec = AtomDeploymentSpec.model_validate({
        "model": {"source": "builtin:tiny"}, "decode": {"replicas": PODS},
        "autoscaling": {"mode": "Operator", "decode": {"minReplicas": 1, "maxReplicas": 8}},
    })  # fmt: skip
    p = policy(spec)
    states = [State() for _ in range(DEPLOYMENTS)]
    previous: list[dict] = [{} for _ in range(DEPLOYMENTS)]
    walls: list[float] = []
    scrapes: list[float] = []
    failed = [0]
    began_cpu = cpu()
    gate = asyncio.Semaphore(CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(d: int) -> None:
            urls = {f"p{k}": f"http://{address(d * PODS + k)}:{PORT}/metrics" for k in range(PODS)}
            began = time.monotonic()
            found = await scrape(session, urls, gate=gate)
            scrapes.append(time.monotonic() - began)
            failed[0] += sum(v is None for v in found.values())
            role = observe.RoleReading(PODS, [observe.PodReading(n, True, False, s, previous[d].get(n))
                                       for n, s in found.items()])  # fmt: skip
            previous[d] = {n: s for n, s in found.items() if s is not None}
            states[d] = decide(observe.observations(role, None), states[d], p, time.time()).state

        for _ in range(count):
            started = time.monotonic()
            if work:
                await asyncio.gather(*(one(d) for d in range(DEPLOYMENTS)))
            walls.append(time.monotonic() - started)
            await asyncio.sleep(max(0.0, PERIOD - walls[-1]))
    rounds.scrapes, rounds.failed = scrapes, failed[0]  # type: ignore[attr-defined]
    return walls, (cpu() - began_cpu) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(DEPLOYMENTS * PODS)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        _idle_walls, idle_cpu = asyncio.run(rounds(2, work=False))
        walls, busy_cpu = asyncio.run(rounds(args.rounds, work=True))
    finally:
        server.kill()
        server.wait()
    ms = sorted(w * 1000 for w in walls)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    one = sorted(x * 1000 for x in rounds.scrapes)  # type: ignore[attr-defined]
    one_p99 = one[min(len(one) - 1, round(0.99 * (len(one) - 1)))]
    per_round = busy_cpu - idle_cpu
    lines = [
        "# Autoscaling: the loop's own cost at fleet scale (`make bench-autoscale-scrape`)",
        "",
        f"{DEPLOYMENTS} autoscaled deployments x {PODS} pods (one server process on {DEPLOYMENTS * PODS} loopback"
        f" addresses, each answering with an engine's own /metrics rendering), scraped ({CONCURRENCY} at once,"
        " as the operator's loop) and decided every"
        f" {PERIOD:.0f} s by the operator's scrape, observe and decide; {args.rounds} rounds. A shared 2-core"
        " machine: figures are noisy, and the 400 fake pods share one process, whose rendering bounds the scrape"
        " times (real pods answer in parallel).",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| round wall time p50 | {statistics.median(ms):.0f} ms |",
        f"| round wall time p99 | {p99:.0f} ms |",
        f"| one deployment's scrape (4 pods) p50 / p99 | {statistics.median(one):.0f} / {one_p99:.0f} ms |",
        f"| pod scrapes that failed or timed out (1 s) | {rounds.failed} of {len(one) * PODS} |",  # type: ignore[attr-defined]
        f"| CPU per round (idle round subtracted) | {per_round * 1000:.0f} ms |",
        f"| CPU share at one round every {PERIOD:.0f} s | {per_round / PERIOD * 100:.1f} % of one core |",
        "",
    ]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
