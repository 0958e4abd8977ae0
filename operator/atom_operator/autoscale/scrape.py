"""Reading each Ready pod's /metrics directly (no Prometheus in the loop): bounded concurrency, a timeout per pod.

A pod that does not answer in time, refuses, or answers with something that is not the text format is None in the
result; the decision treats it as missing (fail-static), and the caller counts it as a scrape error.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

CONCURRENCY = 64  # pods scraped at once across every deployment: the loop's one gate and its connection pool
TIMEOUT_SECONDS = 1.0
MAX_BYTES = 1 << 20  # an engine's /metrics is a few kB; more is not an engine


@dataclass(frozen=True)
class Sample:
    """One scrape of one pod: when (the operator's monotonic clock) and each metric's value, summed over series."""

    time: float
    values: Mapping[str, float]

    def get(self, name: str, default: float = 0.0) -> float:
        return self.values.get(name, default)


def parse(text: str) -> dict[str, float]:
    """The Prometheus text format as {name: value}, series of one name summed (an engine labels its series by its
    model, and its vLLM names by engine index "0"); histogram buckets and ``_created`` series are left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if not name or name.endswith(("_bucket", "_created")):
            continue
        number = float(value)  # ValueError: not the text format
        if math.isfinite(number):
            out[name] = out.get(name, 0.0) + number
    return out


async def scrape(
    session: aiohttp.ClientSession,
    urls: Mapping[str, str],
    *,
    concurrency: int = CONCURRENCY,
    timeout: float = TIMEOUT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    gate: asyncio.Semaphore | None = None,
) -> dict[str, Sample | None]:
    """{pod: its sample, or None} for ``urls`` ({pod: http://ip:port/metrics}), at most ``concurrency`` at once.

    ``gate``: one bound shared by every caller (the loop scrapes all deployments at once); each pod's timeout
    starts once it holds the gate, so a long queue is not mistaken for a pod that does not answer. The session's
    connection pool must allow at least as many connections, for the same reason."""
    gate = gate or asyncio.Semaphore(concurrency)
    limit = aiohttp.ClientTimeout(total=timeout)

    async def one(url: str) -> Sample | None:
        async with gate:
            try:
                async with session.get(url, timeout=limit) as resp:
                    if resp.status != 200:
                        return None
                    body = await resp.content.read(MAX_BYTES + 1)
                    if len(body) > MAX_BYTES:
                        return None
                    return Sample(clock(), parse(body.decode("utf-8", "replace")))
            except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeError):
                return None

    names = list(urls)
    found = await asyncio.gather(*(one(urls[n]) for n in names))
    return dict(zip(names, found, strict=True))
