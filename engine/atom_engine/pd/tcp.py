"""The plain-TCP KV transport: one connection per request, the frame received straight into the source slot.

Decode side (:class:`TcpTransport`): connect, send the request (:data:`~atom_engine.pd.wire.REQUEST`), send a
heartbeat byte every quarter of the lease until the frame starts, then receive the frame: its small prefix and
header into bytes, its payload with ``recv_into`` directly into the slot's preallocated buffer (no intermediate
copy), hashing each piece as it lands. Every wait is bounded (connect, the first byte, each piece, the whole
attempt), and until the answer starts so is every silence: the worker acknowledges the request and each
heartbeat, so a worker that says nothing for a whole lease has stopped (a stopped or hung process whose kernel
still accepts connections) and is failed then, not after the response timeout, which must cover a long queue and
prefill. Cancelling a fetch closes the socket, which is how the worker learns that the decoder left.

Worker side (:class:`TcpServer`, :class:`TcpConnection`): accept, read one request, and while it is queued or
computing, watch the socket: end of stream (the decoder closed or died) or no heartbeat for the request's lease
(the decoder hangs, or its host vanished without a FIN) sets the request's ``gone`` event, which stops the
prefill before its next chunk and drops the request; each heartbeat heard is acknowledged until the answer
starts. The frame is sent with ``sendmsg`` straight from the tensors' memory; the kernel's socket buffers are the
backpressure, and a decoder that takes nothing for the send timeout is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from atom_engine.pd.transport import (
    PrefillRequest,
    Timeouts,
    TransferStats,
    WorkerFailed,
    WorkerRefused,
    refuses_the_request,
)
from atom_engine.pd.wire import (
    ACK,
    ERROR,
    FRAME,
    HEARTBEAT,
    MISWIRED,
    PING,
    REQUEST,
    CorruptTransfer,
    Expect,
    Shipment,
    SpeaksHttp,
    message,
    read_frame,
    read_message,
)

log = logging.getLogger("atom_engine.pd")
SOCKET_BUFFER = 4 << 20  # asked of the kernel for both directions (it may cap it)
# The most one receive takes: hashed right after it lands, while it is still in the core's L2 (512 KiB or more on
# current server cores; a piece of 1 MiB spilled half of itself to L3 before the hash read it back).
PIECE = 128 << 10
# Bytes received without returning to the event loop: a large frame that keeps the kernel's buffer full must not
# stall the server's other streams for the whole transfer.
YIELD_EVERY = 4 << 20


class StreamEnded(ConnectionError):
    """The peer closed the stream before a message was whole."""


class Silent(TimeoutError):
    """The worker sent nothing, not even an acknowledgement, for a whole lease before its answer."""


def answers_http(address: str) -> str:
    """What a decoder says of a prefillWorkers address that answered with HTTP."""
    return f"{address} answers HTTP: {MISWIRED}"


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


async def _ready(sock: socket.socket, timeout: float, *, writing: bool) -> None:
    """Until the socket can be read (or written) without blocking, at most ``timeout`` seconds (TimeoutError)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = sock.fileno()
    add, remove = (loop.add_writer, loop.remove_writer) if writing else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: ready.done() or ready.set_result(None))
    try:
        async with asyncio.timeout(timeout):
            await ready
    finally:
        remove(fd)


def _tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)


class SocketReader:
    """:class:`~atom_engine.pd.wire.Reader` on a non-blocking socket: the first byte may take ``first``
    seconds (the worker's queue and the prefill), each later piece ``each``.

    A piece is whatever the kernel holds when asked, up to :data:`PIECE` bytes; only when it holds nothing does
    the reader wait on the event loop, bounded by a timeout armed for that wait alone (bytes already there cost
    one ``recv_into`` and no timer). ``started_at``/``finished_at``: the first byte in, the payload's last byte
    in and hashed."""

    def __init__(self, sock: socket.socket, first: float, each: float) -> None:
        self.sock, self.first, self.each = sock, first, each
        self.loop = asyncio.get_running_loop()
        self.received = 0
        self.started_at = self.finished_at = 0.0

    async def skip(self, byte: bytes, silence: float) -> None:
        """Consume the ``byte``s that come before the first message (the worker's acknowledgements) until a
        message's first byte is next: the whole wait bounded by ``first``, each silence by ``silence``
        (:class:`Silent`)."""
        deadline = self.loop.time() + self.first
        while True:
            try:
                head = self.sock.recv(64, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                head = None
            if head == b"":
                raise StreamEnded("the stream ended before a message")
            if head:
                skipped = len(head) - len(head.lstrip(byte))
                if skipped:
                    self.sock.recv(skipped)  # exactly the bytes peeked: there, so no wait
                if skipped < len(head):
                    return
                continue
            left = deadline - self.loop.time()
            if left <= 0:
                raise TimeoutError
            try:
                await _ready(self.sock, min(left, silence), writing=False)
            except TimeoutError:
                if silence < left:
                    raise Silent from None
                raise

    async def read_exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        await self._fill(memoryview(buf), None)
        return bytes(buf)

    async def read_into(self, view: memoryview, hasher: Any) -> None:
        await self._fill(view, hasher)
        self.finished_at = time.perf_counter()

    async def _fill(self, view: memoryview, hasher: Any) -> None:
        done, total, since_yield = 0, len(view), 0
        while done < total:
            if since_yield >= YIELD_EVERY:
                await asyncio.sleep(0)
                since_yield = 0
            n = await self._recv(view[done : done + PIECE])
            if n == 0:
                raise StreamEnded(f"the stream ended after {done} of {total} bytes")
            if not self.received:
                self.started_at = time.perf_counter()
            if hasher is not None:  # while the piece is still in the cache the kernel copied it through
                hasher.update(view[done : done + n])
            done += n
            since_yield += n
            self.received += n

    async def _recv(self, view: memoryview) -> int:
        """One piece into ``view``: what the kernel holds now, else the first bytes to arrive within the wait's
        bound."""
        try:
            return self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            pass
        async with asyncio.timeout(self.each if self.received else self.first):
            return await self.loop.sock_recv_into(self.sock, view)


class TcpTransport:
    """The decode side's :class:`~atom_engine.pd.transport.KVTransport` over plain TCP."""

    def __init__(self, timeouts: Timeouts | None = None) -> None:
        self.timeouts = timeouts or Timeouts()
        self.stats = TransferStats()

    async def fetch(self, address: str, request: PrefillRequest, expect: Expect,
                    buffer: bytearray | memoryview | None) -> Shipment:
        t = self.timeouts
        _ = expect.header_fields  # hashes the token ids now, while the worker prefills, not between the frame's bytes
        sock = await self._connect(address)
        reader = SocketReader(sock, t.response, t.read)
        beating: asyncio.Task | None = None
        try:
            async with asyncio.timeout(t.total):
                await asyncio.get_running_loop().sock_sendall(sock, message(REQUEST, request.header(t.lease)))
                beating = asyncio.create_task(self._heartbeats(sock, reader))
                await reader.skip(ACK, t.lease)
                kind, header = await read_message(reader, (FRAME, ERROR))
                if kind == ERROR:
                    status = header.get("status")
                    text = f"HTTP {status}: {str(header.get('message'))[:300]}"
                    if refuses_the_request(status):
                        code = header.get("code")
                        raise WorkerRefused(text, status=status, code=code if isinstance(code, str) else None)
                    # 503: the worker is draining (or not serving yet) and did nothing: as good as not there.
                    raise WorkerFailed(text, unanswered=status == 503)
                ship = await read_frame(reader, expect, buffer, header)
            self.stats.transfer_seconds += reader.finished_at - reader.started_at
            return ship
        except Silent as exc:
            raise WorkerFailed(f"the worker went silent: nothing, not even an acknowledgement, for {t.lease:g}s"
                               " (a stopped or hung process)") from exc
        except TimeoutError as exc:
            raise WorkerFailed(f"timed out (connect {t.connect}s, first byte {t.response}s, read {t.read}s,"
                               f" total {t.total}s)") from exc
        except SpeaksHttp as exc:  # a miswired pool, not a corrupt transfer: say which setting names what
            raise WorkerFailed(answers_http(address)) from exc
        except CorruptTransfer as exc:
            raise WorkerFailed(f"corrupt KV transfer refused: {exc}") from exc
        except OSError as exc:  # reset, or the stream ended: before any byte, a worker stopping or not there yet
            raise WorkerFailed(f"{type(exc).__name__}: {exc}", unanswered=reader.received == 0) from exc
        finally:
            self.stats.bytes_received += reader.received
            if beating is not None:
                beating.cancel()
            sock.close()  # before anything else can wait: a cancel reaches the worker as the end of the stream

    async def _connect(self, address: str) -> socket.socket:
        host, port = split_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            _tune(sock)
            async with asyncio.timeout(self.timeouts.connect):
                await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except TimeoutError as exc:
            sock.close()
            raise WorkerFailed(f"connect timed out after {self.timeouts.connect}s", unanswered=True) from exc
        except OSError as exc:
            sock.close()
            raise WorkerFailed(f"cannot connect to {address}: {exc}", unanswered=True) from exc
        except BaseException:
            sock.close()
            raise
        return sock

    async def _heartbeats(self, sock: socket.socket, reader: SocketReader) -> None:
        """Renew the worker's lease on the request until the frame starts."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            while not reader.received:
                await asyncio.sleep(self.timeouts.lease / 4)
                if not reader.received:
                    await loop.sock_sendall(sock, HEARTBEAT)

    async def ping(self, address: str) -> bool:
        try:
            sock = await self._connect(address)
        except WorkerFailed:
            return False
        try:
            async with asyncio.timeout(self.timeouts.connect):
                await asyncio.get_running_loop().sock_sendall(sock, message(PING, {}))
                kind, _ = await read_message(SocketReader(sock, self.timeouts.connect, self.timeouts.connect),
                                             (PING,))
                return kind == PING
        except SpeaksHttp:
            log.warning("event=kv_ping_failed worker=%s error=%s", address, answers_http(address))
            return False
        except (OSError, TimeoutError, CorruptTransfer):
            return False
        finally:
            sock.close()

    async def close(self) -> None:
        pass  # one connection per fetch: nothing outlives it


class TcpConnection:
    """The worker's end of one decoder's connection."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock, self.peer = sock, peer
        self.loop = asyncio.get_running_loop()
        self.sending = False  # the frame has started: the lease no longer applies, the send timeouts do
        self.sent = 0

    async def read_request(self, timeout: float) -> tuple[bytes, dict[str, Any]]:
        """The request (or a ping); CorruptTransfer for anything else, StreamEnded/OSError/TimeoutError for a
        decoder that left or said nothing."""
        async with asyncio.timeout(timeout):
            return await read_message(SocketReader(self.sock, timeout, timeout), (REQUEST, PING))

    async def watch(self, lease: float, gone: threading.Event) -> str:
        """Until the decoder leaves or its lease expires (then ``gone`` is set): why it ended. Acknowledges the
        request at once and each heartbeat heard, until the answer starts."""
        self._ack()
        while True:
            try:
                async with asyncio.timeout(None if self.sending else lease):
                    data = await self.loop.sock_recv(self.sock, 4096)
            except TimeoutError:
                if self.sending:
                    continue
                reason = f"lease expired (nothing heard for {lease:g}s)"
                break
            except OSError as exc:
                reason = f"decoder gone ({type(exc).__name__})"
                break
            if not data:
                reason = "decoder gone (end of stream)"
                break
            if data.strip(HEARTBEAT):
                reason = "protocol error (bytes other than heartbeats after the request)"
                break
            self._ack()
        gone.set()
        return reason

    def _ack(self) -> None:
        """One acknowledgement byte, unless the answer has started (it must not land inside a message): sent
        without waiting, since it is one byte between messages; a socket with no room for it is a decoder that
        reads nothing, which learns nothing from it."""
        if not self.sending:
            with contextlib.suppress(OSError):  # a decoder gone: the watch hears it
                self.sock.send(ACK)

    async def send(self, parts: list[memoryview | bytes], timeout: float) -> None:
        """Write ``parts`` in order with ``sendmsg`` (one syscall takes all of them while the socket has room, as
        one ``sendall`` of a contiguous buffer would); a decoder that takes nothing for ``timeout`` seconds is
        dropped (``sent`` counts what went out)."""
        self.sending = True
        views = [v for v in (memoryview(p).cast("B") for p in parts) if v.nbytes]  # the tensors' memory: no copy
        while views:
            try:
                n = self.sock.sendmsg(views)
            except (BlockingIOError, InterruptedError):
                await _ready(self.sock, timeout, writing=True)
                continue
            self.sent += n
            while n:
                if n >= views[0].nbytes:
                    n -= views.pop(0).nbytes
                else:
                    views[0], n = views[0][n:], 0

    async def send_error(self, status: int, text: str, code: str, timeout: float) -> None:
        """Best effort: a decoder that is gone gets nothing."""
        with contextlib.suppress(OSError, TimeoutError):
            await self.send([message(ERROR, {"status": status, "message": text, "code": code})], timeout)

    async def finish(self, linger: float = 1.0) -> None:
        """Close after the peer had the chance to read what was sent: closing with unread input would reset the
        connection and could lose the last message (an error's explanation)."""
        with contextlib.suppress(OSError, TimeoutError):
            self.sock.shutdown(socket.SHUT_WR)
            async with asyncio.timeout(linger):
                while await self.loop.sock_recv(self.sock, 65536):
                    pass
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


class TcpServer:
    """The worker's listener: each connection served by ``handle`` in its own task."""

    def __init__(self, handle: Callable[[TcpConnection], Awaitable[None]]) -> None:
        self.handle = handle
        self.port = 0
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._serving: set[asyncio.Task] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: a free port); the port bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=512)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._accepting = asyncio.get_running_loop().create_task(self._accept(self._listener))
        return self.port

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, a reset in the backlog: keep listening
                log.warning("event=kv_accept_failed error=%r", exc)
                await asyncio.sleep(0.1)
                continue
            _tune(sock)
            task = loop.create_task(self._serve(TcpConnection(sock, f"{peer[0]}:{peer[1]}")))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    async def _serve(self, conn: TcpConnection) -> None:
        try:
            await self.handle(conn)
            await conn.finish()
        except Exception:  # a bug in the handler: that connection only
            log.exception("event=kv_connection_error peer=%s", conn.peer)
        finally:
            conn.close()

    async def close(self, grace: float = 0.0) -> None:
        """Stop listening; let requests under way finish for ``grace`` seconds, then cut them."""
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
        if self._serving and grace > 0:
            await asyncio.wait(set(self._serving), timeout=grace)
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
