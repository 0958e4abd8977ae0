"""The prefill role's KV side: each decoder connection on the KV port (:mod:`atom_engine.pd.tcp`) asks for one
prompt's KV, which is computed in the compute thread and sent back as one frame (:mod:`atom_engine.pd.wire`).

A request is held (``prefill_in_flight``) from the moment it is read until the worker has let go of it: sent,
refused, failed, or dropped because its decoder left (end of stream) or stopped renewing its lease (no heartbeat
while queued or computing). A dropped request stops before its next prefill chunk and sends nothing; a decoder
gone mid-send costs one info line. Errors go back as an error message with an HTTP-like status (400: a bad
request, 500: the prefill failed), never as a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from atom_engine.errors import RequestRejected
from atom_engine.pd.tcp import TcpConnection
from atom_engine.pd.wire import MISWIRED, PING, CorruptTransfer, SpeaksHttp, message
from atom_engine.sequence import MAX_LOGPROBS
from atom_engine.server.error_responses import error_body
from atom_engine.stats import ServiceStats

if TYPE_CHECKING:  # torch: imported once the server loads the worker, not before it listens
    from atom_engine.pd.worker import PrefillWorker

log = logging.getLogger("atom_engine.prefill")
LEASE_MIN, LEASE_MAX = 0.1, 300.0  # what a decoder may ask for (its heartbeats come four times per lease)


@dataclass(frozen=True)
class Job:
    """One prefill request as read off the wire."""

    request_id: str
    tokens: list[int]
    start: int
    prompt_logprobs: int | None
    lease: float


class PrefillService:
    def __init__(self, worker: PrefillWorker, compute: Executor, *, send_timeout: float,
                 request_timeout: float = 10.0) -> None:
        """``compute``: the one thread that loaded the worker; prefills run there, one at a time."""
        self.worker = worker
        self.compute = compute
        self.send_timeout = send_timeout
        self.request_timeout = request_timeout  # a connection that says nothing for this long is closed
        self.counters = ServiceStats()

    def stats(self) -> ServiceStats:
        return replace(self.counters)

    async def serve(self, conn: TcpConnection) -> None:
        """One decoder connection: a ping, or one request and its frame."""
        try:
            kind, body = await conn.read_request(self.request_timeout)
        except SpeaksHttp as exc:  # an HTTP client on the KV port: answer it in HTTP, so it learns which port
            log.info("event=kv_http_request peer=%s", conn.peer)
            await self._refuse_http(conn, exc)
            return
        except CorruptTransfer as exc:  # garbage on the KV port: say so and close, nothing else
            log.info("event=kv_bad_message peer=%s error=%s", conn.peer, exc)
            await conn.send_error(400, f"bad KV request: {exc}", "invalid_request", self.send_timeout)
            return
        except (OSError, TimeoutError) as exc:
            log.info("event=kv_connection_closed peer=%s error=%r", conn.peer, exc)
            return
        if kind == PING:
            await self._pong(conn)
            return
        try:
            job = self.parse(body)
        except (ValueError, KeyError, TypeError) as exc:
            await conn.send_error(400, f"bad prefill request: {exc}", "invalid_request", self.send_timeout)
            return
        self.counters.prefill_requests += 1
        self.counters.prefill_in_flight += 1
        try:
            await self._serve(conn, job)
        finally:
            self.counters.prefill_in_flight -= 1

    async def _refuse_http(self, conn: TcpConnection, exc: SpeaksHttp) -> None:
        """An HTTP 400 with an OpenAI error body that names the two ports, then the connection closes."""
        if not exc.request:  # an HTTP answer sent to a worker: nobody to explain it to in HTTP
            await conn.send_error(400, f"bad KV request: {exc}", "invalid_request", self.send_timeout)
            return
        text = ("this is a prefill worker's KV transport port (pdKvPort), which speaks no HTTP: HTTP clients use the"
                f" worker's HTTP port; {MISWIRED}")
        body = json.dumps(error_body(400, text, code="wrong_port")).encode()
        head = ("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        with contextlib.suppress(OSError, TimeoutError):
            await conn.send([head, body], self.send_timeout)

    async def _pong(self, conn: TcpConnection) -> None:
        try:
            await conn.send([message(PING, {"ready": True})], self.send_timeout)
        except (OSError, TimeoutError):
            pass

    def parse(self, body: dict[str, Any]) -> Job:
        rid, tokens, start = str(body["request_id"]), body["prompt_token_ids"], body["start"]
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens) or type(start) is not int:
            raise TypeError("prompt_token_ids must be a list of ints and start an int")
        top = body.get("prompt_logprobs")
        if top is not None and (type(top) is not int or not 0 <= top <= MAX_LOGPROBS):
            raise ValueError(f"prompt_logprobs must be an int in [0, {MAX_LOGPROBS}] or null; got {top!r}")
        lease = body.get("lease_seconds")
        if type(lease) not in (int, float) or not LEASE_MIN <= lease <= LEASE_MAX:
            raise ValueError(f"lease_seconds must be a number in [{LEASE_MIN}, {LEASE_MAX}]; got {lease!r}")
        self.worker.validate(tokens, start)
        return Job(rid, tokens, start, top, float(lease))

    async def _serve(self, conn: TcpConnection, job: Job) -> None:
        gone = threading.Event()
        watcher = asyncio.create_task(conn.watch(job.lease, gone))
        work = asyncio.create_task(self._prefill(job, gone))
        try:
            await asyncio.wait({watcher, work}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():  # the decoder left or its lease expired: stop the work, wait until it let go
                reason = watcher.result()
                if reason.startswith("lease"):
                    self.counters.prefill_leases_expired += 1
                log.info("event=prefill_dropped request_id=%s peer=%s reason=%s", job.request_id, conn.peer, reason)
                work.cancel()
                await asyncio.wait({work})
                return
            try:
                encoded = work.result()
            except RequestRejected as exc:
                await conn.send_error(400, str(exc), "invalid_request", self.send_timeout)
                return
            except Exception as exc:  # noqa: BLE001 - a producer error: the decoder retries or fails the request
                log.warning("event=prefill_failed request_id=%s error=%r", job.request_id, exc)
                await conn.send_error(500, f"prefill failed: {exc}", "prefill_failed", self.send_timeout)
                return
            if encoded is None or watcher.done():  # the decoder left just as the compute finished: send nothing
                log.info("event=prefill_dropped request_id=%s peer=%s reason=decoder gone", job.request_id, conn.peer)
                return
            head, parts = encoded
            await self._send(conn, job.request_id, head, parts)
        finally:
            watcher.cancel()
            work.cancel()
            await asyncio.gather(watcher, work, return_exceptions=True)

    async def _prefill(self, job: Job, gone: threading.Event) -> tuple[bytes, list[memoryview]] | None:
        """The prefill in the compute thread; cancelled (the decoder left), it sets ``gone`` and returns only once
        the compute thread let go (before its next chunk), so ``prefill_in_flight`` drops when the work stopped."""
        done: Future = self.compute.submit(self._compute, job, gone)
        try:
            return await asyncio.wrap_future(done)
        except asyncio.CancelledError:
            gone.set()
            await asyncio.wait({asyncio.wrap_future(done)})
            raise

    def _compute(self, job: Job, gone: threading.Event) -> tuple[bytes, list[memoryview]] | None:
        """In the compute thread: the prefill, and its frame (encoding converts the logits with torch)."""
        from atom_engine.pd import wire

        ship = self.worker.compute(job.request_id, job.tokens, job.start, gone, job.prompt_logprobs)
        return None if ship is None else wire.encode(ship)

    async def _send(self, conn: TcpConnection, rid: str, head: bytes, parts: list[memoryview]) -> None:
        self.counters.prefill_sends_started += 1
        try:
            await conn.send([head, *parts], self.send_timeout)
        except (OSError, TimeoutError) as exc:  # a decoder gone mid-send: nobody to answer
            self.counters.prefill_sends_failed += 1
            log.info("event=prefill_send_failed request_id=%s peer=%s sent=%d error=%r", rid, conn.peer,
                     conn.sent, exc)
            return
        finally:
            self.counters.prefill_bytes_sent += conn.sent
        log.info("event=prefill_sent request_id=%s bytes=%d", rid, conn.sent)
