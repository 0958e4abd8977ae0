"""A source slot's staging buffer is sized to the shipments it takes, not to a whole maxSeqLen sequence: a pod
commits the KV it receives, and a larger shipment replaces the buffer (at least doubling it, never past the most a
shipment can need) without disturbing the tensors of the shipment before, which may still view the old one."""

from __future__ import annotations

import asyncio

import pytest
import torch
from atom_engine.pd.remote import RemotePrefill

pytestmark = pytest.mark.asyncio(loop_scope="session")

LAYOUT = dict(layers=2, kv_heads=1, head_dim=4, vocab=8, dtype=torch.float32)
MAX_SEQ_LEN = 1000


def need(tokens: int) -> int:
    """K and V of ``tokens`` tokens and one token's float32 logits, in LAYOUT."""
    return 2 * LAYOUT["layers"] * LAYOUT["kv_heads"] * tokens * LAYOUT["head_dim"] * 4 + 4 * LAYOUT["vocab"]


class RecordingClient:
    """Writes a marker into the buffer it is given and keeps it, as a transport's received payload."""

    def __init__(self) -> None:
        self.buffers: list[memoryview] = []

    async def fetch(self, expect, prompt, buffer):  # noqa: ANN001, ANN201
        assert len(buffer) >= expect.payload_bytes
        buffer[:4] = len(self.buffers).to_bytes(4, "little")
        self.buffers.append(buffer)
        return len(buffer)


async def fetch(remote: RemotePrefill, slot: int, tokens: int) -> memoryview:
    done = remote.submit(f"r{tokens}", list(range(tokens)), 0, slot, lambda: None).future
    await asyncio.wrap_future(done)
    return remote.client.buffers[-1]  # type: ignore[attr-defined]


async def test_a_slot_buffer_grows_with_its_shipments_and_keeps_the_last_ones_view() -> None:
    remote = RemotePrefill(RecordingClient(), asyncio.get_running_loop())  # type: ignore[arg-type]
    remote.layout = LAYOUT
    remote.slot_bytes = need(MAX_SEQ_LEN)

    first = await fetch(remote, 0, 10)
    assert len(first) == need(10)  # not need(MAX_SEQ_LEN): nothing committed beyond the shipment
    reused = await fetch(remote, 0, 4)
    assert reused.obj is first.obj  # a smaller shipment reuses it

    grown = await fetch(remote, 0, 11)
    assert grown.obj is not first.obj and len(grown) == 2 * need(10)  # doubled: a few replacements at most
    assert int.from_bytes(reused[:4], "little") == 1  # the shipment before still reads its own bytes
    assert (await fetch(remote, 0, 15)).obj is grown.obj

    other = await fetch(remote, 1, 3)
    assert len(other) == need(3) and len(remote.buffers) == 2  # each slot its own

    big = await fetch(remote, 0, 600)
    assert len(big) == need(600)  # past twice the old: just what it needs
    full = await fetch(remote, 0, 900)
    assert len(full) == need(MAX_SEQ_LEN)  # twice would pass the most a shipment can need: capped there
    assert len(await fetch(remote, 0, MAX_SEQ_LEN)) == need(MAX_SEQ_LEN)
