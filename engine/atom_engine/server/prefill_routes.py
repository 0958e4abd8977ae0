"""The prefill role's HTTP side: ``POST /v1/kv/prefill`` computes a prompt's KV and streams it back as one frame.

Request JSON: ``{"request_id": str, "prompt_token_ids": [int], "start": int}``; the response is
``application/octet-stream`` (see :mod:`atom_engine.pd.wire`) or an OpenAI-style JSON error (400, 500). Every
write has a timeout, so a decoder that stops reading frees the worker after ``sendTimeoutSeconds``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from atom_engine.errors import RequestRejected
from atom_engine.pd.faults import Faults
from atom_engine.sequence import MAX_LOGPROBS
from atom_engine.server.errors import error_response

if TYPE_CHECKING:  # torch: imported once the server loads the worker, not before it listens
    from atom_engine.pd.worker import PrefillWorker

log = logging.getLogger("atom_engine.prefill")
WRITE_PIECE = 1 << 20


@dataclass
class ServiceStats:
    """The service's figures for /metrics (the table in :mod:`atom_engine.server.metrics` names these fields)."""

    prefill_requests: int = 0
    prefill_in_flight: int = 0  # accepted and not yet let go: queued, computing or sending
    prefill_sends_started: int = 0
    prefill_sends_failed: int = 0
    prefill_bytes_sent: int = 0


class PrefillService:
    def __init__(self, worker: PrefillWorker, compute: Executor, *, send_timeout: float,
                 faults: Faults | None = None) -> None:
        """``compute``: the one thread that loaded the worker; prefills run there, one at a time."""
        self.worker = worker
        self.send_timeout = send_timeout
        self.faults = faults or Faults()
        self.compute = compute
        self.counters = ServiceStats()

    ROUTES = (("POST", "/v1/kv/prefill", "prefill"),)  # method, path, handler: the server registers these

    def stats(self) -> dict[str, float]:
        return asdict(self.counters)

    async def prefill(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            rid, tokens, start = str(body["request_id"]), body["prompt_token_ids"], body["start"]
            if not isinstance(tokens, list) or not all(type(t) is int for t in tokens) or type(start) is not int:
                raise TypeError("prompt_token_ids must be a list of ints and start an int")
            top = body.get("prompt_logprobs")
            if top is not None and (type(top) is not int or not 0 <= top <= MAX_LOGPROBS):
                raise ValueError(f"prompt_logprobs must be an int in [0, {MAX_LOGPROBS}] or null; got {top!r}")
            self.worker.validate(tokens, start)
        except (ValueError, KeyError, TypeError) as exc:
            return error_response(400, f"bad prefill request: {exc}", param=None)
        self.counters.prefill_requests += 1
        self.counters.prefill_in_flight += 1
        let_go_here = True  # False once the compute thread owns the let-go (the decoder left mid-prefill)
        try:
            gone = threading.Event()
            try:
                await self.faults.hold(tokens)
                if Faults.matches(self.faults.fail_marker, tokens):
                    raise RuntimeError("injected prefill failure")
                job = self.compute.submit(self._compute, rid, tokens, start, gone, top)
                try:
                    encoded = await asyncio.wrap_future(job)
                except asyncio.CancelledError:
                    gone.set()  # the compute stops before its next chunk (or never starts)
                    loop = asyncio.get_running_loop()
                    job.add_done_callback(lambda _f: loop.call_soon_threadsafe(self._let_go))
                    let_go_here = False
                    raise
            except asyncio.CancelledError:
                log.info("event=prefill_abandoned request_id=%s", rid)
                raise
            except RequestRejected as exc:
                return error_response(400, str(exc), param="prompt_token_ids")
            except Exception as exc:  # noqa: BLE001 - a producer error: the decoder retries or fails the request
                log.warning("event=prefill_failed request_id=%s error=%r", rid, exc)
                return error_response(500, f"prefill failed: {exc}", err_type="internal_error",
                                      code="prefill_failed")
            assert encoded is not None
            head, parts = encoded
            if Faults.matches(self.faults.corrupt_marker, tokens):
                broken = bytearray(parts[0])
                broken[0] ^= 0xFF
                parts[0] = memoryview(bytes(broken))
            return await self._send(request, rid, head, parts)
        finally:
            if let_go_here:
                self._let_go()

    def _let_go(self) -> None:
        self.counters.prefill_in_flight -= 1

    def _compute(self, rid: str, tokens: list[int], start: int, gone: threading.Event, top: int | None
                 ) -> tuple[bytes, list[memoryview]] | None:
        """In the compute thread: the prefill, and its frame (encoding converts the logits with torch)."""
        from atom_engine.pd import wire

        ship = self.worker.compute(rid, tokens, start, gone, top)
        return None if ship is None else wire.encode(ship)

    async def _send(self, request: web.Request, rid: str, head: bytes, parts: list[memoryview]
                    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = len(head) + sum(p.nbytes for p in parts)
        self.counters.prefill_sends_started += 1
        sent = 0
        try:
            await asyncio.wait_for(resp.prepare(request), self.send_timeout)
            for part in [memoryview(head), *parts]:
                for off in range(0, part.nbytes, WRITE_PIECE):
                    piece = part[off : off + WRITE_PIECE]
                    stall = self.faults.stall_after_bytes
                    if stall is not None and sent + piece.nbytes > stall:
                        await asyncio.wait_for(resp.write(bytes(piece[: max(0, stall - sent)])), self.send_timeout)
                        log.warning("event=prefill_send_stalled request_id=%s bytes=%d (fault injection)", rid, stall)
                        await asyncio.sleep(3600)
                    await asyncio.wait_for(resp.write(piece), self.send_timeout)  # no copy: tensors outlive it
                    sent += piece.nbytes
            await asyncio.wait_for(resp.write_eof(), self.send_timeout)
        except (TimeoutError, ConnectionError) as exc:
            self.counters.prefill_sends_failed += 1
            log.warning("event=prefill_send_failed request_id=%s sent=%d error=%r", rid, sent, exc)
            raise
        finally:
            self.counters.prefill_bytes_sent += sent
        log.info("event=prefill_sent request_id=%s bytes=%d", rid, sent)
        return resp
