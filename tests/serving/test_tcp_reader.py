"""The decode side's socket reader (pd/tcp.py SocketReader): however the kernel hands a frame over, in one
segment or a byte at a time, the same tensors land in the slot; every wait stays bounded."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import torch
from atom_engine.pd import tcp
from atom_engine.pd.tcp import SocketReader, StreamEnded
from atom_engine.pd.wire import Expect, Shipment, frame_bytes, read_frame

pytestmark = pytest.mark.asyncio(loop_scope="session")
L, H, D, V = 2, 2, 4, 11


def shipment(n: int) -> Shipment:
    g = torch.Generator().manual_seed(n)
    return Shipment("r1", 0, list(range(10, 10 + n)), torch.randn(L, H, n, D, generator=g),
                    torch.randn(L, H, n, D, generator=g), torch.randn(V, generator=g))


def expect(ship: Shipment) -> Expect:
    return Expect(ship.request_id, ship.start, ship.token_ids, L, H, D, V, ship.k.dtype)


@pytest_asyncio.fixture(loop_scope="session")
async def pair() -> AsyncIterator[tuple[socket.socket, socket.socket]]:
    """A connected pair: the decoder's end (non-blocking, as the transport's) and the worker's."""
    decoder, worker = socket.socketpair()
    decoder.setblocking(False)
    worker.setblocking(False)
    try:
        yield decoder, worker
    finally:
        decoder.close()
        worker.close()


async def send_in_pieces(sock: socket.socket, data: bytes, size: int) -> None:
    """``data`` in pieces of ``size`` bytes, letting the reader run between them (so it waits for each)."""
    loop = asyncio.get_running_loop()
    for at in range(0, len(data), size):
        await loop.sock_sendall(sock, data[at : at + size])
        await asyncio.sleep(0)


def assert_same(got: Shipment, ship: Shipment) -> None:
    assert torch.equal(got.k, ship.k) and torch.equal(got.v, ship.v) and torch.equal(got.logits, ship.logits)
    assert got.token_ids == ship.token_ids


@pytest.mark.parametrize("piece", [1, 7, 1 << 20], ids=["byte-by-byte", "odd-pieces", "one-segment"])
async def test_a_frame_gives_the_same_tensors_however_it_is_cut(pair, piece: int) -> None:  # noqa: ANN001
    decoder, worker = pair
    ship = shipment(5)
    data = frame_bytes(ship)
    reader = SocketReader(decoder, first=5.0, each=5.0)
    sending = asyncio.create_task(send_in_pieces(worker, data, piece))
    got = await read_frame(reader, expect(ship), bytearray(4096))
    await sending
    assert_same(got, ship)
    assert reader.received == len(data)
    assert 0 < reader.started_at <= reader.finished_at


async def test_a_payload_larger_than_one_piece_is_received_in_bounded_pieces(pair, monkeypatch) -> None:  # noqa: ANN001
    decoder, worker = pair
    monkeypatch.setattr(tcp, "PIECE", 64)  # the frame's payload is some hundred bytes
    asked: list[int] = []
    real = SocketReader._recv

    async def recording(self: SocketReader, view: memoryview) -> int:
        asked.append(len(view))
        return await real(self, view)

    monkeypatch.setattr(SocketReader, "_recv", recording)
    ship = shipment(9)
    worker.sendall(frame_bytes(ship))  # all there before the reader starts: each receive takes what it may
    got = await read_frame(SocketReader(decoder, first=5.0, each=5.0), expect(ship), bytearray(4096))
    assert_same(got, ship)
    assert max(asked) == 64 and len(asked) > ship.payload_bytes // 64


async def test_a_stalled_piece_times_out_within_its_bound(pair) -> None:  # noqa: ANN001
    decoder, worker = pair
    ship = shipment(5)
    data = frame_bytes(ship)
    worker.sendall(data[: len(data) // 2])  # half the frame, then nothing
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        await read_frame(SocketReader(decoder, first=30.0, each=0.2), expect(ship), bytearray(4096))
    assert loop.time() - start < 5.0  # the piece's bound, not the first byte's


async def test_nothing_at_all_times_out_at_the_first_byte_bound(pair) -> None:  # noqa: ANN001
    decoder, _worker = pair
    ship = shipment(3)
    reader = SocketReader(decoder, first=0.2, each=30.0)
    with pytest.raises(TimeoutError):
        await read_frame(reader, expect(ship), bytearray(4096))
    assert reader.received == 0


async def test_a_stream_that_ends_mid_payload_is_an_error(pair) -> None:  # noqa: ANN001
    decoder, worker = pair
    ship = shipment(5)
    worker.sendall(frame_bytes(ship)[:-10])
    worker.shutdown(socket.SHUT_WR)
    with pytest.raises(StreamEnded, match="the stream ended after"):
        await read_frame(SocketReader(decoder, first=5.0, each=5.0), expect(ship), bytearray(4096))


async def test_the_header_checks_are_computed_once_per_expect() -> None:
    e = expect(shipment(4))
    assert e.header_fields is e.header_fields
    assert e.header_fields["k_shape"] == [L, H, 4, D] and e.kv_bytes == L * H * 4 * D * 4


class _AlwaysReady:
    """A socket whose kernel buffer never runs dry (a fast sender and a large frame): every receive fills."""

    def recv_into(self, view: memoryview) -> int:
        view[:] = b"\0" * len(view)
        return len(view)


async def test_a_large_frame_that_never_waits_still_lets_the_event_loop_serve_others() -> None:
    reader = SocketReader(_AlwaysReady(), first=1.0, each=1.0)  # type: ignore[arg-type]
    ticks = 0

    async def other_streams() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_streams())
    await asyncio.sleep(0)
    before = ticks
    await reader.read_into(memoryview(bytearray(16 * tcp.YIELD_EVERY)), None)
    other.cancel()
    assert ticks - before >= 15  # the reader gave the loop back at every YIELD_EVERY bytes
