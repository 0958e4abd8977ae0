"""The shared-prefix workload of the routing comparison, and what it measures.

``groups`` long prefixes (a system prompt and a document each), every request one of them plus a short question of
its own. Sized so that the prefixes fit the replicas' prefix caches together but not one replica's: a router
that keeps each prefix on one replica hits its cache; one that spreads every prefix over every replica evicts.
Rounds visit every group once, in a fresh random order each round (seeded, the same for every router). The first
round warms up (each group's first request cannot hit anywhere); the rest is measured:

* prefix hit rate: Δ``vllm:prefix_cache_hits`` / Δ``vllm:prefix_cache_queries`` (prompt tokens) summed over the
  replicas' /metrics, around the measured rounds;
* TTFT: from sending the request to the first streamed token, at the client, through the router.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import time
from dataclasses import dataclass

import aiohttp

WORDS = ("river mountain engine lantern copper violet harbor signal meadow canyon falcon orbit velvet glacier"
         " ember thistle quartz willow tundra beacon saddle prism cobalt juniper marble nectar pillar raven"
         " summit tide anchor basalt cedar delta fjord granite hollow iris kelp lagoon mesa north opal pine").split()


@dataclass(frozen=True)
class Workload:
    groups: int = 6
    rounds: int = 8  # the first warms up
    prefix_words: int = 200  # about 1.3 tokens a word for SmolLM2's tokenizer
    max_tokens: int = 4
    concurrency: int = 2
    seed: int = 7

    def prefix(self, g: int) -> str:
        rng = random.Random(self.seed * 1000 + g)
        return (f"System: you answer questions about document {g}.\nDocument {g}: "
                + " ".join(rng.choice(WORDS) for _ in range(self.prefix_words)) + "\n")

    def schedule(self) -> list[list[tuple[int, str]]]:
        """Per round, the (group, prompt) pairs in sending order."""
        rng = random.Random(self.seed)
        out, n = [], 0
        for _ in range(self.rounds):
            order = list(range(self.groups))
            rng.shuffle(order)
            batch = []
            for g in order:
                n += 1
                batch.append((g, f"{self.prefix(g)}Question {n}: what does word {n % 97} of document {g} say?\n"))
            out.append(batch)
        return out


async def scrape(url: str, session: aiohttp.ClientSession) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for m in re.finditer(r"^([a-zA-Z_:]+)(?:{[^}]*})? ([0-9.eE+-]+)$", text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


async def ttft(url: str, model: str, prompt: str, max_tokens: int, session: aiohttp.ClientSession) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    started = time.perf_counter()
    first = None
    async with session.post(f"{url}/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{r.status} from the router: {(await r.text())[:500]}")
        async for line in r.content:
            if first is None and line.startswith(b"data: {") and json.loads(line[6:]).get("choices"):
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first


@dataclass(frozen=True)
class Result:
    hit_rate: float
    ttft_p50: float
    ttft_p90: float
    requests_per_pod: tuple[int, ...]
    seconds: float


def percentile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


async def run(router: str, pods: list[str], model: str, w: Workload) -> Result:
    rounds = w.schedule()
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        sem = asyncio.Semaphore(w.concurrency)

        async def one(prompt: str) -> float:
            async with sem:
                return await ttft(router, model, prompt, w.max_tokens, s)

        await asyncio.gather(*(one(p) for _g, p in rounds[0]))  # warm-up
        before = [await scrape(p, s) for p in pods]
        started = time.monotonic()
        ttfts = await asyncio.gather(*(one(p) for batch in rounds[1:] for _g, p in batch))
        seconds = time.monotonic() - started
        after = [await scrape(p, s) for p in pods]

    def delta(name: str) -> float:
        return sum(a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before, strict=True))

    per_pod = tuple(int(a.get("atom:requests_finished_total", 0) - b.get("atom:requests_finished_total", 0))
                    for a, b in zip(after, before, strict=True))
    hits, queries = delta("vllm:prefix_cache_hits_total"), delta("vllm:prefix_cache_queries_total")
    return Result(hits / queries if queries else 0.0, statistics.median(ttfts), percentile(list(ttfts), 90),
                  per_pod, seconds)
