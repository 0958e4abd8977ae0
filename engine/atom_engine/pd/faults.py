"""Fault injection for the prefill worker, for tests only: ``ATOM_ENGINE_FAULTS`` holds ``key=value`` pairs
separated by ``;``. Unset (as in every pod) it does nothing. A prompt "matches" a marker when its bytes (token
ids below 256, the built-in byte tokenizer's) contain the marker text.

- ``fail_marker=TEXT``: fail those prefills with HTTP 500 (a producer error);
- ``corrupt_marker=TEXT``: flip one payload byte after the checksum is computed (a corrupt transfer);
- ``hold_dir=PATH``: a prompt containing ``HOLD:name;`` is held until ``PATH/name`` exists (at most 60 s);
- ``stall_after_bytes=N``: after N bytes of any frame, stall (until the connection or the process dies).
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path

HOLD_MAX_SECONDS = 60.0


@dataclass(frozen=True)
class Faults:
    fail_marker: str | None = None
    corrupt_marker: str | None = None
    hold_dir: str | None = None
    stall_after_bytes: int | None = None

    @classmethod
    def from_env(cls) -> Faults:
        raw = os.environ.get("ATOM_ENGINE_FAULTS", "")
        pairs = dict(p.split("=", 1) for p in raw.split(";") if "=" in p)
        stall = pairs.pop("stall_after_bytes", None)
        return cls(**pairs, stall_after_bytes=int(stall) if stall else None)

    @staticmethod
    def matches(marker: str | None, tokens: list[int]) -> bool:
        return bool(marker) and marker.encode() in bytes(t for t in tokens if t < 256)

    async def hold(self, tokens: list[int]) -> None:
        if not self.hold_dir:
            return
        found = re.search(rb"HOLD:([a-z0-9-]+);", bytes(t for t in tokens if t < 256))
        if found is None:
            return
        release = Path(self.hold_dir) / found.group(1).decode()
        for _ in range(int(HOLD_MAX_SECONDS / 0.02)):
            if release.exists():
                return
            await asyncio.sleep(0.02)
