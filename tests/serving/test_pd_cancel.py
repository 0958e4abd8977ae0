"""A cancelled PD request cancels its fetch, and the cancel reaches the prefill worker: the worker lets go of the
request (its in-flight count back to 0) while the KV would still be on its way, computes and sends nothing more
for it, and the decode side's source slot is free at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from atom_engine.kv_blocks import SourceSlots
from atom_engine.pd.remote import RemoteConnector, RemotePrefill
from atom_engine.pd.wire import FRAME
from atom_engine.sequence import FinishReason, SamplingParams, Sequence

from tests.serving.conftest import (
    BASE,
    MODEL,
    Proc,
    assert_no_block_leaked,
    client,
    idle,
    in_process,
    reference_tokens,
    scrape,
    spawn,
    wait_metrics,
    wait_ready_sync,
)
from tests.serving.test_pd import PROMPTS, answer_kind, complete_all, decode_settings, open_kv

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_cancel_while_the_worker_holds_the_request_reaches_the_worker(
        prefill_pair: list[Proc], hold_dir: Path) -> None:
    worker = prefill_pair[0]
    async with in_process("decode", **decode_settings([worker], False)) as (_s, url):
        before = await scrape(worker.url)
        doomed = asyncio.create_task(client(url).completions.create(
            model=MODEL, prompt="HOLD:cancel-reaches; a prompt that is never shipped", max_tokens=4))
        await wait_metrics(worker.url, lambda m: m["atom:prefill_in_flight"] == 1, "the worker to take it")
        doomed.cancel()  # the client leaves while the worker still holds the request (the KV not yet sent)
        with pytest.raises(asyncio.CancelledError):
            await doomed
        m = await wait_metrics(url, idle, "the decode side to let go")
        assert_no_block_leaked(m)  # the source slot is free without waiting for the worker
        w = await wait_metrics(worker.url, lambda m: m["atom:prefill_in_flight"] == 0, "the worker to let go")
        assert w["atom:prefill_tokens_computed_total"] == before["atom:prefill_tokens_computed_total"]
        assert w["atom:prefill_sends_started_total"] == before["atom:prefill_sends_started_total"]
        (hold_dir / "cancel-reaches").touch()
        assert await complete_all(url, PROMPTS[:2]) == reference_tokens(PROMPTS[:2], 12)


async def test_a_cancel_mid_prefill_stops_the_worker_before_its_next_chunk(prefill_pair: list[Proc]) -> None:
    worker = prefill_pair[0]
    prompt = "SLOWLY " + "a long prompt, chunk after chunk. " * 8  # 9 chunks of 32 tokens, each slowed down
    async with in_process("decode", **decode_settings([worker], False)) as (_s, url):
        before = await scrape(worker.url)
        doomed = asyncio.create_task(client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=4))
        await wait_metrics(worker.url, lambda m: m["atom:prefill_tokens_computed_total"]
                           > before["atom:prefill_tokens_computed_total"], "the prefill to be under way")
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        w = await wait_metrics(worker.url, lambda m: m["atom:prefill_in_flight"] == 0, "the worker to let go")
        assert w["atom:prefills_abandoned_total"] == before["atom:prefills_abandoned_total"] + 1
        assert w["atom:prefill_tokens_computed_total"] - before["atom:prefill_tokens_computed_total"] < len(prompt)
        assert w["atom:prefill_sends_started_total"] == before["atom:prefill_sends_started_total"]
        assert_no_block_leaked(await wait_metrics(url, idle, "idle"))
        assert w["atom:kv_blocks_lanes"] == 0
    assert "Traceback" not in worker.log.read_text()


async def test_a_vanished_decoder_s_lease_expires_and_the_worker_reclaims_the_request(
        prefill_pair: list[Proc], hold_dir: Path) -> None:
    worker = prefill_pair[1]
    before = await scrape(worker.url)
    # The decoder's host is gone without a FIN (its socket stays open here): no heartbeat ever comes.
    _reader, writer = await open_kv(worker, b"HOLD:vanished; never shipped", "vanished-1", lease=0.3)
    try:
        m = await wait_metrics(worker.url, lambda m: m["atom:prefill_leases_expired_total"]
                               == before["atom:prefill_leases_expired_total"] + 1 and m["atom:prefill_in_flight"] == 0,
                               "the lease to expire and the worker to let go")
        assert m["atom:kv_blocks_lanes"] == 0
        assert m["atom:prefill_tokens_computed_total"] == before["atom:prefill_tokens_computed_total"]
        assert m["atom:prefill_sends_started_total"] == before["atom:prefill_sends_started_total"]
        assert not writer.is_closing()  # reclaimed by the lease, not by an end of stream
    finally:
        writer.close()
        (hold_dir / "vanished").touch()


async def test_a_live_decoder_s_heartbeats_keep_a_slow_request(prefill_pair: list[Proc]) -> None:
    worker = prefill_pair[0]
    prompt = "SLOWLY long enough to outlive a short lease, twice over."  # 2 chunks of 0.5 s, lease 0.3 s
    async with in_process("decode", **decode_settings([worker], False, pd_lease_seconds=0.3)) as (_s, url):
        before = await scrape(worker.url)
        assert await complete_all(url, [prompt]) == reference_tokens([prompt], 12)
        m = await scrape(worker.url)
        assert m["atom:prefill_leases_expired_total"] == before["atom:prefill_leases_expired_total"]


class StubbornClient:
    """A fetch that goes on writing for a while after it is cancelled (as a transfer caught mid-write)."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.finish = asyncio.Event()

    async def fetch(self, expect, prompt, buffer):  # noqa: ANN001, ANN201
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            await self.finish.wait()  # still "writing" into the slot
            raise


async def test_a_cancelled_fetch_keeps_its_slot_until_it_has_stopped() -> None:
    stub = StubbornClient()
    remote = RemotePrefill(stub, asyncio.get_running_loop())  # type: ignore[arg-type]
    remote.layout = dict(layers=1, kv_heads=1, head_dim=1, vocab=2, dtype=torch.float32)
    connector = RemoteConnector(remote, slots=SourceSlots(1))
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=2))
    # The batcher's calls come from the engine thread.
    assert await asyncio.to_thread(connector.poll, seq) is None  # the fetch starts
    await asyncio.sleep(0.05)
    await asyncio.to_thread(connector.request_finished, seq, FinishReason.CANCELLED)
    await asyncio.wait_for(stub.cancelled.wait(), 5)
    assert connector.slots.held() == 1 and connector.busy()  # the producer may still write: the slot waits
    stub.finish.set()
    for _ in range(250):
        if not connector.busy():
            break
        await asyncio.sleep(0.02)
    assert connector.slots.held() == 0 and not connector.busy()


async def test_a_decoder_gone_mid_send_is_one_info_line_on_the_worker(tmp_path: Path) -> None:
    # A frame larger than the sockets' buffers (32000 tokens of the tiny model: 16 MB, against the worker's 8 MiB
    # send buffer and the decoder's 64 KiB), and a decoder that reads its first bytes and dies: the send fails.
    settings = {**BASE, "max_seq_len": 32768, "prefill_chunk": 2048, "lanes": 1, "kv_blocks": 2,
                "prefix_cache": False}
    worker = spawn(tmp_path, "big-frames", "prefill", settings)
    try:
        await asyncio.to_thread(wait_ready_sync, worker)
        reader, writer = await open_kv(worker, bytes(i % 200 + 32 for i in range(32000)), "dies-mid-send", 120,
                                       receive_buffer=64 << 10)
        assert await answer_kind(reader, 120) == FRAME  # the send started
        writer.transport.abort()  # the decoder dies (a reset: its unread bytes are dropped)
        # The failure is counted before the request lets go of its watcher (an await later): wait for both, so a
        # leaked hold still fails here, by the timeout.
        m = await wait_metrics(worker.url, lambda m: m["atom:prefill_sends_failed_total"] == 1
                               and m["atom:prefill_in_flight"] == 0, "the send to fail and the request to let go")
        assert m["atom:prefill_bytes_sent_total"] < 16 << 20
        log = worker.log.read_text()
        assert log.count("event=prefill_send_failed") == 1 and "Traceback" not in log, log[-3000:]
    finally:
        worker.kill()
