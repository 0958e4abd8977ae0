"""The KV frame: what goes in comes out bit for bit, and every kind of damage is refused before import."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import torch
import xxhash
from atom_engine.pd.client import PrefillClient
from atom_engine.pd.tcp import StreamEnded
from atom_engine.pd.wire import PREFIX, VERSION, CorruptTransfer, Expect, Shipment, frame_bytes, read_frame

pytestmark = pytest.mark.asyncio(loop_scope="session")
L, H, D, V = 2, 2, 4, 11


def shipment(n: int = 3, dtype: torch.dtype = torch.float32) -> Shipment:
    g = torch.Generator().manual_seed(n)
    return Shipment("r1", 5, list(range(10, 10 + n)), torch.randn(L, H, n, D, generator=g).to(dtype),
                    torch.randn(L, H, n, D, generator=g).to(dtype), torch.randn(V, generator=g))


def expect(ship: Shipment, **change: object) -> Expect:
    base = dict(request_id=ship.request_id, start=ship.start, token_ids=ship.token_ids, layers=L, kv_heads=H,
                head_dim=D, vocab=V, dtype=ship.k.dtype)
    return Expect(**{**base, **change})


class BytesReader:
    """The wire's Reader over bytes in memory, in pieces of 1000 bytes (as a socket hands them over)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    async def read_exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        await self.read_into(memoryview(buf), None)
        return bytes(buf)

    async def read_into(self, view: memoryview, hasher: Any) -> None:
        done = 0
        while done < len(view):
            piece = self.data[self.at : self.at + min(1000, len(view) - done)]
            if not piece:
                raise StreamEnded(f"the stream ended after {done} of {len(view)} bytes")
            view[done : done + len(piece)] = piece
            if hasher is not None:
                hasher.update(piece)
            done += len(piece)
            self.at += len(piece)


async def read(data: bytes, want: Expect, buffer: bytearray | None = None) -> Shipment:
    return await read_frame(BytesReader(data), want, buffer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
async def test_frame_round_trips_exactly_into_the_slot_buffer(dtype: torch.dtype) -> None:
    ship = shipment(dtype=dtype)
    buffer = bytearray(4096)
    got = await read(frame_bytes(ship), expect(ship), buffer)
    assert torch.equal(got.k, ship.k) and torch.equal(got.v, ship.v) and torch.equal(got.logits, ship.logits)
    assert got.token_ids == ship.token_ids and got.start == 5
    got.k.zero_()  # the tensors are views of the slot's buffer: no copy between the socket and the import
    assert not any(buffer[: got.k.numel() * got.k.element_size()])


def _patch_header(data: bytes, **fields: object) -> bytes:
    import json

    kind, version, flags, n, _sum = PREFIX.unpack(data[: PREFIX.size])
    header = json.loads(data[PREFIX.size : PREFIX.size + n])
    header.update(fields)
    raw = json.dumps(header).encode()
    return PREFIX.pack(kind, version, flags, len(raw), xxhash.xxh3_64_intdigest(raw)) + raw + data[PREFIX.size + n :]


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda b: b"XXXX" + b[4:], "not a KV transport message"),
        (lambda b: b[:4] + bytes([9]) + b[5:], f"version 9; this engine speaks version {VERSION}"),
        (lambda b: b[: PREFIX.size + 3] + b"#" + b[PREFIX.size + 4 :], "header checksum"),
        (lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], "payload checksum"),
        (lambda b: _patch_header(b, request_id="someone-else"), "request_id"),
        (lambda b: _patch_header(b, tokens_xxh3=12345), "tokens_xxh3 does not match"),
        (lambda b: _patch_header(b, tokens=4), "field tokens is 4; expected 3"),
        (lambda b: _patch_header(b, k_shape=[L, H, 4, D]), "k_shape"),
        (lambda b: _patch_header(b, dtype="float16"), "dtype is 'float16' but this decode engine runs 'float32'"),
        (lambda b: _patch_header(b, kv_layout="tokens,layers,kv_heads,head_dim"),
         "kv_layout is 'tokens,layers,kv_heads,head_dim' but this decode engine reads 'layers,kv_heads,tokens"),
        (lambda b: _patch_header(b, payload_bytes=1), "payload_bytes"),
        (lambda b: struct.pack("<4sBBIQ", b"ATKV", VERSION, 0, 1 << 30, 0), "header of 1073741824 bytes exceeds"),
        (lambda b: _patch_header(b, tokens=4000, k_shape=[L, H, 4000, D], v_shape=[L, H, 4000, D],
                                 payload_bytes=2 * L * H * 4000 * D * 4 + 4 * V), "field tokens is 4000"),
    ],
)
async def test_damaged_frames_are_refused(damage, needle: str) -> None:  # noqa: ANN001
    ship = shipment()
    with pytest.raises(CorruptTransfer, match=needle):
        await read(damage(frame_bytes(ship)), expect(ship))


async def test_a_frame_of_another_dtype_is_refused_not_converted() -> None:
    ship = shipment(dtype=torch.bfloat16)  # e.g. a bfloat16 prefill worker feeding a float32 decode pod
    with pytest.raises(CorruptTransfer, match="prefill and decode must run the same model dtype"):
        await read(frame_bytes(ship), expect(ship, dtype=torch.float32))


async def test_a_frame_of_an_earlier_version_is_refused_naming_both_versions() -> None:
    ship = shipment()
    data = frame_bytes(ship)
    for old in range(1, VERSION):  # version 2 had no acknowledgements: its decoders read them as garbage
        with pytest.raises(CorruptTransfer, match=f"version {old}; this engine speaks version {VERSION}"):
            await read(data[:4] + bytes([old]) + data[5:], expect(ship))


async def test_a_frame_larger_than_the_source_slot_is_refused_before_its_payload_is_read() -> None:
    ship = shipment(n=8)
    reader = BytesReader(frame_bytes(ship))
    with pytest.raises(CorruptTransfer, match="exceeds the source slot"):
        await read_frame(reader, expect(ship), bytearray(64))
    assert reader.at < len(reader.data) - ship.payload_bytes + 1  # nothing of the payload was taken


async def test_truncated_frame_is_an_error() -> None:
    ship = shipment()
    with pytest.raises(StreamEnded, match="the stream ended after"):
        await read(frame_bytes(ship)[:-10], expect(ship))


async def test_client_re_resolves_and_spreads_over_what_it_finds() -> None:
    answers = [["10.0.0.1:8000"], ["10.0.0.1:8000", "10.0.0.2:8000"], ["10.0.0.2:8000"]]
    calls = []

    async def resolver(host: str, port: int) -> list[str]:
        calls.append((host, port))
        return answers[min(len(calls) - 1, 2)]

    c = PrefillClient("workers.ns.svc:8000", resolver=resolver, resolve_interval=0.0)
    assert await c.addresses() == ["10.0.0.1:8000"]
    both = await c.addresses()
    assert {c.pick(both, set()) for _ in range(4)} == set(both)  # idle workers take turns
    c._in_flight["10.0.0.1:8000"] = 2
    assert c.pick(both, set()) == "10.0.0.2:8000"  # the least busy worker is preferred
    assert c.pick(both, {"10.0.0.2:8000"}) == "10.0.0.1:8000"  # a retry goes elsewhere
    assert await c.addresses() == ["10.0.0.2:8000"]  # a worker that went away is dropped
    assert calls == [("workers.ns.svc", 8000)] * 3
