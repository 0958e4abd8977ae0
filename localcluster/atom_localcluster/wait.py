"""Polling with a bound: the one way tests wait for the cluster to converge (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 120, interval: float = 0.3) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail naming ``what`` on timeout."""
    end = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < end:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")
