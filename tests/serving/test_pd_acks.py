"""The worker's acknowledgements (pd/tcp.py): a worker that holds a request longer than a lease keeps the decoder
waiting as long as it acknowledges the heartbeats, and a worker that stops (a stopped or hung process whose kernel
still accepts connections) is failed once it has been silent for a lease, not after the response timeout, which
must cover a long queue and prefill."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio
import torch
from atom_engine.pd.tcp import TcpConnection, TcpServer, TcpTransport
from atom_engine.pd.transport import PrefillRequest, Timeouts, WorkerFailed
from atom_engine.pd.wire import ACK, Expect, Shipment, encode

pytestmark = pytest.mark.asyncio(loop_scope="session")
L, H, D, V = 2, 1, 4, 8
LEASE = 0.4
TIMEOUTS = Timeouts(connect=3.0, response=60.0, read=10.0, total=90.0, lease=LEASE)


def shipment() -> Shipment:
    g = torch.Generator().manual_seed(0)
    return Shipment("r", 0, [5, 6, 7], torch.randn(L, H, 3, D, generator=g), torch.randn(L, H, 3, D, generator=g),
                    torch.randn(V, generator=g))


def expect(ship: Shipment) -> Expect:
    return Expect(ship.request_id, ship.start, ship.token_ids, L, H, D, V, ship.k.dtype)


@pytest_asyncio.fixture(loop_scope="session")
async def worker() -> AsyncIterator[Callable[[Callable[[TcpConnection], Awaitable[None]]], str]]:
    """Starts a TcpServer with the given handler; its address."""
    servers: list[TcpServer] = []

    async def start(handle: Callable[[TcpConnection], Awaitable[None]]) -> str:
        server = TcpServer(handle)
        servers.append(server)
        return f"127.0.0.1:{await server.start('127.0.0.1', 0)}"

    yield start
    for server in servers:
        await server.close()


async def fetch(address: str) -> Shipment:
    ship = shipment()
    request = PrefillRequest(ship.request_id, ship.token_ids, 0)
    return await asyncio.wait_for(TcpTransport(TIMEOUTS).fetch(address, request, expect(ship), None), 30)


async def test_a_worker_that_acknowledges_is_waited_for_past_its_lease(worker) -> None:  # noqa: ANN001
    async def slow(conn: TcpConnection) -> None:
        await conn.read_request(5.0)
        gone = threading.Event()
        watching = asyncio.create_task(conn.watch(LEASE, gone))
        await asyncio.sleep(6 * LEASE)  # a long queue and prefill: the watch acknowledges every heartbeat
        assert not watching.done() and not gone.is_set()
        head, parts = encode(shipment())
        await conn.send([head, *parts], 5.0)
        watching.cancel()

    t0 = time.monotonic()
    got = await fetch(await worker(slow))
    assert time.monotonic() - t0 >= 6 * LEASE
    assert torch.equal(got.k, shipment().k) and torch.equal(got.logits, shipment().logits)


async def test_a_worker_that_never_answers_is_failed_as_silent_not_at_the_response_timeout() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # a stopped worker: its kernel accepts, nothing answers
    try:
        with pytest.raises(WorkerFailed, match=f"went silent: nothing, not even an acknowledgement, for {LEASE:g}s"):
            await fetch(f"127.0.0.1:{listener.getsockname()[1]}")
    finally:
        listener.close()


async def test_a_worker_that_stops_after_acknowledging_is_failed_a_lease_later(worker) -> None:  # noqa: ANN001
    heard = asyncio.Event()

    async def stops(conn: TcpConnection) -> None:
        await conn.read_request(5.0)
        for _ in range(3):  # acknowledges for a while, then stops (SIGSTOP) with the connection open
            conn.sock.send(ACK)
            await asyncio.sleep(LEASE / 2)
        heard.set()
        await asyncio.sleep(3600)

    t0 = time.monotonic()
    with pytest.raises(WorkerFailed, match="went silent"):
        await fetch(await worker(stops))
    assert heard.is_set() and time.monotonic() - t0 >= LEASE  # the acknowledgements renewed the bound


async def test_the_worker_acknowledges_the_request_and_each_heartbeat_until_its_answer_starts() -> None:
    decoder, worker_end = socket.socketpair()
    for s in (decoder, worker_end):
        s.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        conn = TcpConnection(worker_end, "peer")
        gone = threading.Event()
        watching = asyncio.create_task(conn.watch(5.0, gone))
        assert await asyncio.wait_for(loop.sock_recv(decoder, 16), 5) == ACK  # the request, at once
        for _ in range(3):
            await loop.sock_sendall(decoder, b"h")
            assert await asyncio.wait_for(loop.sock_recv(decoder, 16), 5) == ACK
        head, parts = encode(shipment())
        await conn.send([head, *parts], 5.0)  # the answer starts: no acknowledgement may follow inside it
        await loop.sock_sendall(decoder, b"h")
        await asyncio.sleep(0.1)
        frame = head + b"".join(bytes(p) for p in parts)
        received = b""
        while len(received) < len(frame):
            received += await asyncio.wait_for(loop.sock_recv(decoder, 1 << 16), 5)
        await asyncio.sleep(0.1)
        with pytest.raises(BlockingIOError):
            decoder.recv(16)  # nothing after it either
        assert received == frame  # no acknowledgement inside it
        assert not gone.is_set()
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    finally:
        decoder.close()
        worker_end.close()
