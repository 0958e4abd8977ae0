"""Threads under a CPU quota: the engine's threads from the container's allowance vs torch's default (one per host
core), in a cgroup with a CFS quota of 1 and 2 CPUs, quiet and with a competing CPU load.

Each run is a child process that moves itself into a fresh cgroup v1 ``cpu`` group (``cpu.cfs_quota_us``) before
torch loads, sizes its threads (``allowance``: :func:`atom_engine.cpu_allowance.apply`, as the CLI does;
``default``: torch's own choice), loads SmolLM2-135M (``make model``) and times 24 greedy tokens of one request
after a warm-up. The competing load is busy-looping processes outside the group (neighbours on the node), in two
kinds: ``shares``, the neighbours in a group of their own weighted as the kubelet weights pods by their CPU
requests (``cpu.shares`` = 1024 per requested CPU: the engine's pod requests its limit, the neighbours what the node
has left, BestEffort's 2 when nothing is left), so the engine gets what its pod was promised; and ``equal``, each
neighbour weighted as the engine's whole group (a node overcommitted beyond its pods' requests), where the engine
gets less than its quota and no thread count can make up for it.
Needs root and a writable cgroup v1 ``cpu`` hierarchy (or skips with a message). Writes
benchmarks/results/threads.md. Usage: python benchmarks/bench_threads.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "threads.md"
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
TOKENS = 48
SHARES_PER_CPU = 1024  # the kubelet's cpu.shares per requested CPU (MilliCPUToShares)
BEST_EFFORT_SHARES = 2  # the kubelet's minimum, a pod that requests no CPU
CHILD = r"""
import json, os, sys, time
from pathlib import Path
group, policy = sys.argv[1], sys.argv[2]
(Path(group) / "cgroup.procs").write_text(str(os.getpid()))
if policy == "allowance-spinning":  # torch, and OpenMP with it, loaded first: OpenMP's own wait policy stays
    import torch
from atom_engine import cpu_allowance
chosen = cpu_allowance.apply(None) if policy.startswith("allowance") else None  # before torch loads, as the CLI
import torch
if policy.startswith("threads-"):
    torch.set_num_threads(int(policy.removeprefix("threads-")))
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings
e = LLMEngine(EngineSettings(model_source="builtin:smollm2-135m", lanes=1, kv_blocks=3, max_seq_len=256))
params = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
e.generate(["warm up"], SamplingParams(max_tokens=2))
t0 = time.perf_counter()
out = e.generate(["The history of the printing press begins"], params)[0]
print(json.dumps({"seconds": time.perf_counter() - t0, "threads": torch.get_num_threads(),
                  "source": chosen.source if chosen else policy, "tokens": out.token_ids,
                  "wait": chosen.wait_policy if chosen else "default"}))
""".replace("TOKENS", str(TOKENS))


def burn() -> subprocess.Popen:
    loop = "import time\nend = time.time() + 600\nwhile time.time() < end: pass"  # ends by itself
    return subprocess.Popen([sys.executable, "-c", loop])


def one(quota: int, policy: str, load: int, kind: str, timeout: float) -> dict:
    group = CPU_CGROUP / f"atom-bench-threads-{os.getpid()}"
    neighbours = CPU_CGROUP / f"atom-bench-neighbours-{os.getpid()}"
    group.mkdir()
    burners = [burn() for _ in range(load)]
    try:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota * PERIOD_US))
        if load and kind == "shares":
            neighbours.mkdir()
            left = max(0, (os.cpu_count() or 1) - quota)
            (group / "cpu.shares").write_text(str(quota * SHARES_PER_CPU))
            (neighbours / "cpu.shares").write_text(str(left * SHARES_PER_CPU or BEST_EFFORT_SHARES))
            for b in burners:
                (neighbours / "cgroup.procs").write_text(str(b.pid))
        # the policy decides the threads and the wait, not this process's environment
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
        try:
            done = subprocess.run([sys.executable, "-c", CHILD, str(group), policy], env=env, capture_output=True,
                                  text=True, timeout=timeout, check=True)
            return json.loads(done.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            return {"seconds": float("inf"), "threads": None, "source": policy, "tokens": None}
    finally:
        for b in burners:
            b.kill()
            b.wait()
        for g in (group, neighbours):
            for _ in range(50):  # the processes have exited; a group empties once their threads are reaped
                try:
                    g.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--load", type=int, default=2, help="busy-looping neighbour processes in the loaded runs")
    ap.add_argument("--big-node", type=int, default=8,
                    help="threads of the policy that stands for torch's default on a node with this many cores")
    args = ap.parse_args()
    if not os.access(CPU_CGROUP, os.W_OK):
        print(f"bench-threads: {CPU_CGROUP} is not writable (needs root and cgroup v1's cpu controller)")
        return 1
    policies = ("default", f"threads-{args.big_node}", "allowance-spinning", "allowance")
    loads = ((0, "quiet"), (args.load, "shares"), (args.load, "equal"))
    configs = [(q, p, load, kind) for q in (1, 2) for load, kind in loads for p in policies]
    runs: dict[tuple, list[dict]] = {c: [] for c in configs}
    for _ in range(args.rounds):  # interleaved: the machine's noise hits every configuration alike
        for c in configs:
            runs[c].append(one(*c, timeout=args.timeout))
            print(c, runs[c][-1]["seconds"], runs[c][-1]["threads"], flush=True)
    ref = next(r["tokens"] for rs in runs.values() for r in rs if r["tokens"])
    lines = [
        "# Threads under a CPU quota",
        "",
        f"SmolLM2-135M (float32), one request, {TOKENS} greedy tokens after a warm-up, in a cgroup v1 `cpu` group"
        f" with a CFS quota of 1 or 2 CPUs (period {PERIOD_US // 1000} ms); competing load: {args.load}"
        " busy-looping processes outside the group, weighted as the kubelet weights pods by their requests"
        " (`shares`: the engine's pod requests its quota, the neighbours what the node has left, or BestEffort's"
        " minimum) or each as heavy as the engine's whole group (`equal`: a node overcommitted beyond its pods'"
        " requests, where the engine cannot get its quota). `default`: torch's own thread count (one per host core: 2"
        f" here); `threads-{args.big_node}`: what torch's default would be on a {args.big_node}-core node;"
        " `allowance`: the engine's (atom_engine.cpu_allowance, as `atom-engine serve` sets it: the threads, and"
        " OpenMP's waiters sleeping, `OMP_WAIT_POLICY=PASSIVE`); `allowance-spinning`: the same threads with"
        " OpenMP's own wait policy (its waiters spin first; torch loaded before the allowance). Median of"
        f" {args.rounds} interleaved rounds; {os.cpu_count()} CPUs shared with other jobs (load average"
        f" {os.getloadavg()[0]:.1f} at the end): noisy. All runs produced the same tokens: "
        f"{'yes' if all(r['tokens'] in (ref, None) for rs in runs.values() for r in rs) else 'NO'}.",
        "",
        "| quota CPUs | load | threads | chosen by | OpenMP wait | seconds (median) | min..max | vs quiet |",
        "|---:|---|---:|---|---|---:|---:|---:|",
    ]
    for q, p, load, kind in configs:
        secs = [r["seconds"] for r in runs[(q, p, load, kind)]]
        quiet = statistics.median(r["seconds"] for r in runs[(q, p, 0, "quiet")])
        med = statistics.median(secs)
        r0 = runs[(q, p, load, kind)][0]
        label = "quiet" if not load else f"competing, {kind}"
        lines.append(f"| {q} | {label} | {r0['threads']} | {r0['source']} | {r0.get('wait', '?')} | {med:.2f} |"
                     f" {min(secs):.2f}..{max(secs):.2f} | {med / quiet:.2f}x |")
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
