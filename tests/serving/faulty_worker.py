"""A prefill worker with faults armed, for tests only: ``python -m tests.serving.faulty_worker FAULTS serve
--role prefill ...`` runs the engine's CLI with its prefill service replaced by :class:`FaultyService`. Nothing in
``engine/`` knows about it.

FAULTS is ``key=value`` pairs separated by ``;``. A prompt "matches" a marker when its bytes (token ids below 256,
the built-in byte tokenizer's) contain the marker text.

- ``fail_marker=TEXT``: fail those prefills (an error message with status 500, a producer error);
- ``corrupt_marker=TEXT``: flip one payload byte after the checksum is computed (a corrupt transfer);
- ``truncate_marker=TEXT``: send half of the frame, then close the connection (a truncated frame);
- ``oversize_marker=TEXT``: send a frame whose header claims 1 GiB (an oversize frame);
- ``slow_marker=TEXT``: each prefill chunk of those prompts takes SLOW_CHUNK_SECONDS longer;
- ``hold_dir=PATH``: a prompt containing ``HOLD:name;`` is held before its prefill until ``PATH/name`` exists (at
  most HOLD_MAX_SECONDS);
- ``stall_after_bytes=N``: after N bytes of any frame, stall (until the connection or the process dies).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import sys
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from atom_engine.pd.tcp import TcpConnection
from atom_engine.pd.wire import FRAME, PREFIX, VERSION
from atom_engine.server.prefill_service import Job, PrefillService

log = logging.getLogger("atom_engine.prefill")
HOLD_MAX_SECONDS = 60.0
SLOW_CHUNK_SECONDS = 0.5


@dataclass(frozen=True)
class Faults:
    fail_marker: str | None = None
    corrupt_marker: str | None = None
    truncate_marker: str | None = None
    oversize_marker: str | None = None
    slow_marker: str | None = None
    hold_dir: str | None = None
    stall_after_bytes: int | None = None

    @classmethod
    def parse(cls, raw: str) -> Faults:
        pairs = dict(p.split("=", 1) for p in raw.split(";") if "=" in p)
        known = {f.name for f in fields(cls)}
        if unknown := set(pairs) - known:
            raise SystemExit(f"faulty_worker: unknown fault(s) {sorted(unknown)}; known: {sorted(known)}")
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


class FaultyService(PrefillService):
    def __init__(self, *args: Any, faults: Faults, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = faults
        self._tokens: dict[str, list[int]] = {}  # request id -> prompt, for the send-side faults
        runner = self.worker.runner
        plain = runner.prefill_logits
        slow = threading.local()

        def prefill_logits(*a: Any, **kw: Any) -> Any:
            if getattr(slow, "on", False):
                time.sleep(SLOW_CHUNK_SECONDS)
            return plain(*a, **kw)

        runner.prefill_logits = prefill_logits
        self._slow = slow

    async def _prefill(self, job: Job, gone: threading.Event) -> tuple[bytes, list[memoryview]] | None:
        await self.faults.hold(job.tokens)
        if Faults.matches(self.faults.fail_marker, job.tokens):
            raise RuntimeError("injected prefill failure")
        encoded = await super()._prefill(job, gone)
        if encoded is not None and Faults.matches(self.faults.corrupt_marker, job.tokens):
            head, parts = encoded
            broken = bytearray(parts[0])
            broken[0] ^= 0xFF
            encoded = head, [memoryview(bytes(broken)), *parts[1:]]
        self._tokens[job.request_id] = job.tokens
        return encoded

    def _compute(self, job: Job, gone: threading.Event) -> tuple[bytes, list[memoryview]] | None:
        self._slow.on = Faults.matches(self.faults.slow_marker, job.tokens)
        try:
            return super()._compute(job, gone)
        finally:
            self._slow.on = False

    async def _send(self, conn: TcpConnection, rid: str, head: bytes, parts: list[memoryview]) -> None:
        tokens = self._tokens.pop(rid, [])
        frame = b"".join([head, *(bytes(p) for p in parts)])
        if Faults.matches(self.faults.truncate_marker, tokens):
            self.counters.prefill_sends_started += 1
            await conn.send([frame[: len(frame) // 2]], self.send_timeout)
            log.warning("event=prefill_send_truncated request_id=%s (fault injection)", rid)
            return
        if Faults.matches(self.faults.oversize_marker, tokens):
            self.counters.prefill_sends_started += 1
            await conn.send([PREFIX.pack(FRAME, VERSION, 0, 1 << 30, 0)], self.send_timeout)
            return
        stall = self.faults.stall_after_bytes
        if stall is not None:
            self.counters.prefill_sends_started += 1
            await conn.send([frame[:stall]], self.send_timeout)
            log.warning("event=prefill_send_stalled request_id=%s bytes=%d (fault injection)", rid, stall)
            await asyncio.sleep(3600)
        await super()._send(conn, rid, head, parts)


def main(argv: list[str]) -> int:
    import atom_engine.server.app as app
    from atom_engine import cli

    app.PrefillService = functools.partial(FaultyService, faults=Faults.parse(argv[0]))  # type: ignore[misc]
    return cli.main(argv[1:])


if __name__ == "__main__":
    from atom_engine.cli import exit_process

    exit_process(main(sys.argv[1:]))  # the engine's own way out (atom_engine.cli.entrypoint)
