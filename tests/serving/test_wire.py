"""The KV frame: what goes in comes out bit for bit, and every kind of damage is refused before import."""

from __future__ import annotations

import asyncio
import struct
import zlib

import pytest
import torch
from atom_engine.pd.client import PrefillClient
from atom_engine.pd.wire import PREFIX, CorruptTransfer, Expect, Shipment, frame_bytes, read_frame

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


async def read(data: bytes, want: Expect, buffer: bytearray | None = None) -> Shipment:
    stream = asyncio.StreamReader()
    stream.feed_data(data)
    stream.feed_eof()
    return await read_frame(stream.readexactly, want, buffer)


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

    magic, version, flags, n, _crc = PREFIX.unpack(data[: PREFIX.size])
    header = json.loads(data[PREFIX.size : PREFIX.size + n])
    header.update(fields)
    raw = json.dumps(header).encode()
    return PREFIX.pack(magic, version, flags, len(raw), zlib.crc32(raw)) + raw + data[PREFIX.size + n :]


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda b: b"XXXX" + b[4:], "not a KV frame"),
        (lambda b: b[:4] + bytes([9]) + b[5:], "version 9"),
        (lambda b: b[: PREFIX.size + 3] + b"#" + b[PREFIX.size + 4 :], "header checksum"),
        (lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], "payload checksum"),
        (lambda b: _patch_header(b, request_id="someone-else"), "request_id"),
        (lambda b: _patch_header(b, token_ids=[1, 2, 3]), "token_ids"),
        (lambda b: _patch_header(b, k_shape=[L, H, 4, D]), "k_shape"),
        (lambda b: _patch_header(b, dtype="float16"), "dtype is 'float16' but this decode engine runs 'float32'"),
        (lambda b: _patch_header(b, kv_layout="tokens,layers,kv_heads,head_dim"),
         "kv_layout is 'tokens,layers,kv_heads,head_dim' but this decode engine reads 'layers,kv_heads,tokens"),
        (lambda b: _patch_header(b, payload_bytes=1), "payload_bytes"),
        (lambda b: struct.pack("<4sBBII", b"ATKV", 1, 0, 1 << 30, 0), "exceeds"),
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


async def test_a_frame_without_kv_layout_has_the_first_layout() -> None:
    import json

    ship = shipment()
    data = frame_bytes(ship)
    n = PREFIX.unpack(data[: PREFIX.size])[3]
    header = json.loads(data[PREFIX.size : PREFIX.size + n])
    assert header.pop("kv_layout") == "layers,kv_heads,tokens,head_dim"
    raw = json.dumps(header).encode()
    old = PREFIX.pack(b"ATKV", 1, 0, len(raw), zlib.crc32(raw)) + raw + data[PREFIX.size + n :]
    assert torch.equal((await read(old, expect(ship))).k, ship.k)


async def test_truncated_frame_is_an_error() -> None:
    ship = shipment()
    with pytest.raises(asyncio.IncompleteReadError):
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
