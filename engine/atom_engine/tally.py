"""A histogram a component keeps itself and /metrics reads at scrape time, as it reads the counters.

The batcher observes a request's phases on its step thread while a scrape reads from the server's loop: each
observation and each snapshot hold the lock, so a scrape never sees a count that its buckets do not add up to.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A histogram's state: each upper bound with its cumulative count (``+Inf`` last), the sum and the count."""

    buckets: tuple[tuple[float, int], ...]
    sum: float
    count: int


class Tally:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"bucket bounds rise strictly; got {bounds!r}")
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)  # le: a value equal to a bound falls in that bound's bucket
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def snapshot(self) -> Snapshot:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, n in zip([*self.bounds, float("inf")], counts, strict=True):
            running += n
            cumulative.append((bound, running))
        return Snapshot(tuple(cumulative), total, running)
