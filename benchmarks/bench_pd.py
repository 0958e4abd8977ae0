"""PD disaggregation with B1 prefetch: one decode lane, one prefill worker, separate processes on loopback.

Runs ``atom-engine serve --role prefill`` once and ``--role decode`` (lanes=1, remote-only prefill) for every
combination of concurrency {1, 4} x prefetchNext {off, on} x prefixCache {off, on}, on the same greedy workload
(prompts that share a long opening, so a prefix cache can hit), and measures from the client: TTFT p50/p99,
output tokens/s, and from the decode server's /metrics: bytes shipped and the KV transfer rate (bytes over the
time from a frame's first byte to its last). A last run ships long prompts to measure loopback transfer alone.
Checks every configuration returns the same tokens. Writes benchmarks/results/pd.md. Not a test.

    .venv/bin/python benchmarks/bench_pd.py [--requests 32] [--max-tokens 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

RESULTS = Path(__file__).resolve().parent / "results" / "pd.md"
ENGINE_BIN = Path(sys.executable).parent / "atom-engine"
MODEL = {"modelName": "tiny", "modelSource": "builtin:tiny", "prefillChunk": 128}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp: Path, name: str, role: str, settings: dict) -> None:
        config = tmp / f"{name}.yaml"
        config.write_text(yaml.safe_dump(settings))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (tmp / f"{name}.log").open("w")
        self.proc = subprocess.Popen(
            [str(ENGINE_BIN), "serve", "--role", role, "--config", str(config), "--host", "127.0.0.1", "--port",
             str(self.port), "--log-level", "warning"],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})

    async def ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.url} exited with {self.proc.returncode}")
                try:
                    async with s.get(f"{self.url}/ready") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.url} not ready after {timeout}s")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


async def metrics(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name.split("{")[0]] = float(value)
    return out


SYSTEM_TOKENS, SUFFIX_TOKENS, MAX_SEQ_LEN = 768, (256, 1024), 2048


def workload(n: int, seed: int = 0) -> list[str]:
    """Prompts of 1024-1792 bytes (= tokens, byte tokenizer) that all open with the same 768-byte system text:
    long enough that a prompt's prefill and shipment are a real share of its lane time."""
    rng = random.Random(seed)
    system = "".join(rng.choice("abcdefghij klmnop") for _ in range(SYSTEM_TOKENS))
    return [system + "".join(rng.choice("qrstuvwxyz .,") for _ in range(rng.randint(*SUFFIX_TOKENS)))
            for _ in range(n)]


async def run_load(url: str, prompts: list[str], max_tokens: int, concurrency: int) -> dict:
    """Closed loop: ``concurrency`` clients, each sends its next prompt when the last one finished."""
    ttft: list[float] = []
    tokens: dict[int, list[int]] = {}
    queue = list(enumerate(prompts))

    async def one(session: aiohttp.ClientSession, i: int, prompt: str) -> None:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "ignore_eos": True, "return_token_ids": True}
        t0 = time.perf_counter()
        got: list[int] = []
        async with session.post(f"{url}/v1/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
            async for line in r.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                ids = chunk["choices"][0].get("token_ids") or []
                if ids and not got:
                    ttft.append(time.perf_counter() - t0)
                got += ids
        tokens[i] = got

    async def client() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            while queue:
                i, prompt = queue.pop(0)
                await one(session, i, prompt)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    ttft.sort()
    return {"wall": wall, "ttft_p50": ttft[len(ttft) // 2], "ttft_p99": ttft[min(len(ttft) - 1, int(len(ttft) * .99))],
            "tokens_per_s": sum(len(t) for t in tokens.values()) / wall, "tokens": [tokens[i] for i in sorted(tokens)]}


async def bench(args: argparse.Namespace) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="bench-pd-"))
    prompts = workload(args.requests)
    prefill = Server(tmp, "prefill", "prefill", {**MODEL, "maxSeqLen": 8192, "lanes": 1, "kvBlocks": 3,
                                                 "prefixCache": False})
    rows, reference = [], None
    try:
        await prefill.ready()
        for concurrency in (1, 4):
            for prefix_cache in (False, True):
                # Prefetch off and on run side by side, rounds interleaved (off, on, off, on, ...), so drift in
                # the load of this shared machine hits both alike; each row reports its median round.
                servers = {pf: Server(tmp, f"decode-c{concurrency}-pc{int(prefix_cache)}-pf{int(pf)}", "decode", {
                    **MODEL, "maxSeqLen": MAX_SEQ_LEN, "lanes": 1, "kvBlocks": 3 if prefix_cache else 2,
                    "prefixCache": prefix_cache, "localPrefill": False, "prefetchNext": pf,
                    "prefillWorkers": f"127.0.0.1:{prefill.port}", "maxWaiting": 64}) for pf in (False, True)}
                rounds: dict[bool, list[tuple[dict, dict, dict]]] = {False: [], True: []}
                try:
                    for server in servers.values():
                        await server.ready()
                        await run_load(server.url, prompts[:2], 4, 1)  # warm the connections and the graphs
                    for _round in range(args.rounds):
                        for pf, server in servers.items():
                            before = await metrics(server.url)
                            result = await run_load(server.url, prompts, args.max_tokens, concurrency)
                            rounds[pf].append((result, before, await metrics(server.url)))
                finally:
                    for server in servers.values():
                        server.stop()
                for pf in (False, True):
                    ordered = sorted(rounds[pf], key=lambda r: r[0]["tokens_per_s"])
                    result, before, after = ordered[len(ordered) // 2]
                    d = {k: after[k] - before.get(k, 0.0) for k in after}
                    exact = all(r[0]["tokens"] == (reference or r[0]["tokens"]) for r in rounds[pf])
                    reference = reference or result["tokens"]
                    rows.append({"concurrency": concurrency, "prefix_cache": prefix_cache, "prefetch": pf,
                                 **result, "bytes": d["atom:pd_bytes_received_total"],
                                 "rate": d["atom:pd_bytes_received_total"] / max(d["atom:pd_transfer_seconds_total"],
                                                                                 1e-9),
                                 "prefetch_hits": d["atom:prefetch_hits_total"],
                                 "spread": (ordered[0][0]["tokens_per_s"], ordered[-1][0]["tokens_per_s"]),
                                 "exact": f"{'yes' if exact else 'NO'} ({len(rounds[pf])} rounds)"})
                    print(f"c{concurrency} cache={prefix_cache} prefetch={pf}:"
                          f" {[round(r[0]['tokens_per_s']) for r in rounds[pf]]} tok/s", flush=True)
        # Loopback transfer alone: long prompts, big frames (the tiny model's KV is 512 bytes per token).
        decode = Server(tmp, "decode-transfer", "decode", {
            **MODEL, "maxSeqLen": 8192, "lanes": 1, "kvBlocks": 2, "prefixCache": False, "localPrefill": False,
            "prefillWorkers": f"127.0.0.1:{prefill.port}"})
        try:
            await decode.ready()
            long_prompts = ["".join(random.Random(i).choice("abcdef ") for _ in range(8000)) for i in range(4)]
            await run_load(decode.url, long_prompts[:1], 1, 1)
            before = await metrics(decode.url)
            await run_load(decode.url, long_prompts, 1, 1)
            after = await metrics(decode.url)
        finally:
            decode.stop()
        big_bytes = after["atom:pd_bytes_received_total"] - before["atom:pd_bytes_received_total"]
        big_secs = after["atom:pd_transfer_seconds_total"] - before["atom:pd_transfer_seconds_total"]
    finally:
        prefill.stop()
    return report(args, rows, big_bytes, big_secs)


def report(args: argparse.Namespace, rows: list[dict], big_bytes: float, big_secs: float) -> str:
    lines = [
        "# PD disaggregation benchmark (B1 prefetch)",
        "",
        f"builtin:tiny (hidden 64, 2 layers, 2 KV heads x 16, float32: 512 bytes of KV per token); decode lanes=1,"
        f" remote-only prefill on one prefill worker, separate processes over loopback HTTP; {args.requests}"
        f" requests, prompts of {SYSTEM_TOKENS + SUFFIX_TOKENS[0]}-{SYSTEM_TOKENS + SUFFIX_TOKENS[1]} tokens opening"
        f" with the same {SYSTEM_TOKENS} tokens, {args.max_tokens} output tokens each, greedy, closed-loop clients;"
        f" maxSeqLen {MAX_SEQ_LEN} (one KV block = {MAX_SEQ_LEN} tokens); median of"
        f" {args.rounds} rounds per row, prefetch off and on interleaved. {os.cpu_count()} CPUs"
        f" ({platform.machine()}), 1 torch thread per process, load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| concurrency | prefix cache | prefetch | TTFT p50 ms | TTFT p99 ms | output tok/s (median) |"
        " rounds min..max | vs prefetch off | KB shipped | KV transfer MB/s | prefetch hits | same tokens |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    base = {}
    for r in rows:
        key = (r["concurrency"], r["prefix_cache"])
        if not r["prefetch"]:
            base[key] = r["tokens_per_s"]
        gain = r["tokens_per_s"] / base[key] - 1 if r["prefetch"] else 0.0
        lines.append(
            f"| {r['concurrency']} | {'on' if r['prefix_cache'] else 'off'} | {'on' if r['prefetch'] else 'off'} |"
            f" {r['ttft_p50'] * 1e3:.1f} | {r['ttft_p99'] * 1e3:.1f} | {r['tokens_per_s']:.1f} |"
            f" {r['spread'][0]:.0f}..{r['spread'][1]:.0f} |"
            f" {gain * 100:+.1f} % | {r['bytes'] / 1024:.0f} | {r['rate'] / 1e6:.0f} | {r['prefetch_hits']:.0f} |"
            f" {r['exact']} |")
    c1 = [r for r in rows if r["concurrency"] == 1]
    c4_gains = [r["tokens_per_s"] / base[(4, r["prefix_cache"])] - 1 for r in rows
                if r["concurrency"] == 4 and r["prefetch"]]
    ttft1 = sorted(r["ttft_p50"] for r in c1)[len(c1) // 2]
    by_key = {(r["concurrency"], r["prefix_cache"], r["prefetch"]): r["spread"] for r in rows}
    overlap = [f"cache {'on' if pc else 'off'}" for pc in (False, True)
               if by_key[(4, pc, True)][0] <= by_key[(4, pc, False)][1]]
    decode_s = args.max_tokens / max(r["tokens_per_s"] for r in c1)
    lines += [
        "",
        "Why this differs from the reference's +9 % to +53 % at concurrency 4 on NPUs:",
        "",
        "- At concurrency 1 nothing is ever queued while the lane decodes, so nothing is prefetched (0 hits): the"
        " prefetch on/off rows run the same code path and their difference is this machine's noise (2 CPUs"
        " shared with other work, see the load average).",
        f"- At concurrency 4 prefetch moved throughput by {', '.join(f'{g * 100:+.0f} %' for g in c4_gains)}"
        " (cache off, on). The bound is the share of a request's lane time spent waiting for its KV (remote"
        f" prefill, transfer, import): TTFT at concurrency 1 is about {ttft1 * 1e3:.0f} ms against about"
        f" {decode_s * 1e3:.0f} ms of decoding {args.max_tokens} tokens, so hiding it entirely gives at most"
        f" about {ttft1 / (ttft1 + decode_s) * 100:.0f} %.",
        *([f"- The rounds' min..max ranges of prefetch off and on overlap at concurrency 4 ({', '.join(overlap)}):"
           " on this shared machine the gain is suggestive, not established; rerun on quiet cores before"
           " quoting it."] if overlap else []),
        "- On NPUs the prefill worker runs on its own device, truly in parallel with decode. Here the client, the"
        " decode server and the prefill worker share 2 CPU cores, so the overlap is partly eaten by CPU"
        " contention; and the tiny model makes both prefill and decode cheap, so fixed per-request costs (HTTP,"
        " Python scheduling, SSE) weigh more than on a real model, where the prefill of a long prompt dominates.",
        "- With the prefix cache only the uncached suffix is shipped (the KB column); the prefetch keeps that:"
        " it pins the entry it relies on and ships the suffix only.",
        "",
        f"Loopback transfer alone: 4 prompts of 8000 tokens, {big_bytes / 1e6:.1f} MB in {big_secs * 1e3:.1f} ms of"
        f" receiving = {big_bytes / max(big_secs, 1e-9) / 1e9:.2f} GB/s (aiohttp stream, CRC32 and the copy into the"
        " source slot included; compute and queueing excluded).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5, help="rounds per configuration; the median is reported")
    args = p.parse_args()
    text = asyncio.run(bench(args))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
