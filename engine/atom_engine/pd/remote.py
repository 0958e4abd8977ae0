"""Remote-only prefill on the decode side: the KV connector (see :mod:`atom_engine.kv_connector`) that has
prefill workers compute a lane's prompt KV and ship it here; the batcher never prefills, the runner imports.

Threads: the batcher steps in the engine's worker thread; fetches run on the server's event loop. A fetch is a
``concurrent.futures.Future`` (``asyncio.run_coroutine_threadsafe``), its payload lands in a reserved source
slot's staging buffer, and the runner imports it into the lane's block at a later step. Slot bookkeeping is
shared by both threads, so it is done under ``_slot_lock``.

Lifecycle of a shipment (docs/design.md, "PD disaggregation" and "B1 prefetch"):
- the lane is admitted (prefix-cache copy first), a source slot is reserved (or the lane waits for one), and
  the fetch of the uncached suffix starts;
- when the fetch is done the runner imports the KV into the lane's block and samples the first token from the
  shipped logits, and the slot is released;
- when the request ends first (cancel, error), the lane and its block go at once and the fetch is cancelled (its
  connection closes, so the worker stops computing or sending it); the slot stays reserved until the fetch has
  stopped, since until then it may still be writing into the slot.

B1 prefetch (``prefetchNext``, one lane): while the lane decodes, the head of the queue is fetched into the
slot; with a prefix cache its entry is pinned and only the uncached suffix is shipped; at admission the lane
copies from the pinned entry and imports the prefetched KV without a second fetch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import mmap
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from atom_engine.kv_blocks import Allocation, KVBlocks, SourceSlots
from atom_engine.kv_connector import LoadedKV
from atom_engine.pd.client import PrefillClient
from atom_engine.pd.wire import Expect, Shipment
from atom_engine.sequence import FinishReason, Sequence, Status
from atom_engine.stats import RemoteStats

log = logging.getLogger("atom_engine.pd")


class Fetch:
    """One fetch on the event loop, watched from the engine thread (``future``: its shipment or its error).
    ``cancel()`` stops it, which closes its connection, so the worker stops too; ``on_stopped`` runs on the loop
    once the fetch can no longer write into its slot (it returned, failed, was cancelled or never started)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fetch: Callable[[], Coroutine[Any, Any, Shipment]],
                 on_stopped: Callable[[], None]) -> None:
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self._loop = loop
        self._task: asyncio.Task | None = None
        self._cancelled = False
        loop.call_soon_threadsafe(self._start, fetch, on_stopped)

    def _start(self, fetch: Callable[[], Coroutine[Any, Any, Shipment]], on_stopped: Callable[[], None]) -> None:
        if self._cancelled:
            on_stopped()
            self.future.cancel()
            return
        self._task = self._loop.create_task(fetch())
        self._task.add_done_callback(lambda task: self._stopped(task, on_stopped))

    def _stopped(self, task: asyncio.Task, on_stopped: Callable[[], None]) -> None:
        on_stopped()  # before the future completes: whoever sees it done finds the producer gone
        if task.cancelled():
            self.future.cancel()
        elif (exc := task.exception()) is not None:
            self.future.set_exception(exc)
        else:
            self.future.set_result(task.result())

    def cancel(self) -> None:
        """From any thread; the fetch stops at its next await."""
        try:
            self._loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # the loop is closed: nothing runs on it any more
            pass

    def _cancel(self) -> None:
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()


class RemotePrefill:
    """Starts fetches on the event loop for the engine thread; each source slot has its own staging buffer, sized
    to the shipments it has taken (see :meth:`_buffer`)."""

    def __init__(self, client: PrefillClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.layout: dict[str, Any] | None = None  # the model's KV shape, known once it is loaded
        self.slot_bytes = 0  # the most one shipment can need
        self.wakeup: Callable[[], None] = lambda: None
        self.buffers: dict[int, mmap.mmap] = {}  # each slot's; made and replaced on the event loop only

    def configure(self, model: Any) -> None:
        """The loaded model's KV layout (what every frame must match)."""
        cfg = model.cfg
        dtype = model.dtype
        self.layout = dict(layers=cfg.num_layers, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                           vocab=cfg.vocab_size, dtype=dtype)
        # The most a shipment can need: a whole sequence's K and V (maxSeqLen tokens) and one token's logits.
        self.slot_bytes = (2 * cfg.num_layers * cfg.num_kv_heads * model.max_seq_len * cfg.head_dim
                           * dtype.itemsize + 4 * cfg.vocab_size)

    def submit(self, request_id: str, prompt: list[int], start: int, slot: int, on_stopped: Callable[[], None],
               prompt_logprobs: int | None = None) -> Fetch:
        if self.layout is None:
            raise RuntimeError("RemotePrefill.configure() was not called")
        expect = Expect(request_id, start, prompt[start:], **self.layout, prompt_logprobs=prompt_logprobs)
        # The fetch starts on the event loop, which alone touches the buffers: no lock, and the engine thread
        # never makes one.
        fetch = Fetch(self.loop, lambda: self.client.fetch(expect, prompt, self._buffer(slot, expect.payload_bytes)),
                      on_stopped)
        fetch.future.add_done_callback(lambda _f: self.wakeup())
        return fetch

    def _buffer(self, slot: int, need: int) -> memoryview:
        """The slot's staging memory, at least ``need`` bytes. Sized to the shipments the slot takes, not to
        maxSeqLen up front (a pod would commit lanes x a whole sequence's KV it may never ship): a shipment larger
        than the slot's buffer gets a new one, at least twice the old (so a slot is replaced a few times at most)
        and at most ``slot_bytes``. Replaced, never resized: an earlier shipment's tensors may still view the old
        one, which goes with them. Anonymous memory: making it writes nothing, its pages are faulted in by the
        socket's copy into them, off the engine thread and without the GIL (a bytearray zero-fills holding it)."""
        buffer = self.buffers.get(slot)
        if buffer is None or len(buffer) < need:
            size = need if buffer is None else max(need, min(self.slot_bytes, 2 * len(buffer)))
            buffer = self.buffers[slot] = mmap.mmap(-1, size)
        return memoryview(buffer)


@dataclass
class Transfer:
    slot: int
    start: int
    prefetched: bool = False
    source: int | None = None  # a prefetch's pinned prefix-cache entry, until the lane copies from it
    fetch: Fetch | None = None
    holders: int = 2  # the producer (the fetch) and the consumer (the lane); the slot is free when both let go

    @property
    def future(self) -> concurrent.futures.Future:
        assert self.fetch is not None
        return self.fetch.future


class RemoteConnector:
    """The decode side's :class:`~atom_engine.kv_connector.KVConnector`: every prompt's KV (after the prefix the
    lane's block copied from the cache) comes from a prefill worker; B1 prefetch is its policy."""

    def __init__(self, remote: RemotePrefill, *, slots: SourceSlots, prefetch_next: bool = False) -> None:
        self.remote = remote
        self.slots = slots
        self.prefetch_next = prefetch_next
        self.kv: KVBlocks | None = None  # the engine's blocks, for a prefetch's prefix lookup (bind)
        self.transfers: dict[str, Transfer] = {}
        self._imports: dict[str, tuple[Transfer, Shipment]] = {}  # handed to the lane, its slot still held
        self.prefetch_id: str | None = None  # at most one prefetch; held until imported or its producer is done
        self._slot_lock = threading.Lock()  # slots and prefetch_id: released from the event loop's thread too
        self.counters = RemoteStats()  # the counters; the gauges (slots, prefetch) are read in stats()

    def ships(self, seq: Sequence) -> bool:
        return True  # remote-only: every prompt's KV comes from a worker

    def bind(self, kv: KVBlocks, model: Any) -> None:
        """The engine's KV blocks (where a prefetch pins the prompt's cached prefix) and its loaded model (the KV
        layout every shipment must match)."""
        self.kv = kv
        self.remote.configure(model)

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        """How to wake the engine loop when a shipment arrives."""
        self.remote.wakeup = wakeup

    # -- state ------------------------------------------------------------------------------------
    def busy(self) -> bool:
        with self._slot_lock:
            return self.slots.held() > 0 or self.prefetch_id is not None

    def prefetch_ready(self) -> bool:
        """A prefetched shipment has arrived and waits for its lane (its slot stays reserved until then)."""
        t = self.transfers.get(self.prefetch_id or "")
        return t is not None and t.prefetched and t.future.done()

    def stats(self) -> RemoteStats:
        with self._slot_lock:
            held = self.slots.held()
        return replace(self.counters, slots_held=held, prefetch_ready=1.0 if self.prefetch_ready() else 0.0)

    def _reserve(self, request_id: str) -> int | None:
        with self._slot_lock:
            return self.slots.reserve(request_id)

    def _start(self, seq_id: str, prompt: list[int], start: int, slot: int, prompt_logprobs: int | None, *,
               prefetched: bool = False, source: int | None = None) -> Transfer:
        t = self.transfers[seq_id] = Transfer(slot, start, prefetched=prefetched, source=source)
        t.fetch = self.remote.submit(seq_id, prompt, start, slot, lambda: self._let_go(seq_id, t), prompt_logprobs)
        self.counters.remote_prefills += 1
        return t

    def _let_go(self, request_id: str, t: Transfer) -> None:
        """The producer or the consumer is done with the slot (either thread); the last one frees it."""
        with self._slot_lock:
            t.holders -= 1
            if t.holders:
                return
            self.slots.release(request_id)
            if self.prefetch_id == request_id:
                self.prefetch_id = None
        self.remote.wakeup()

    # -- the scheduler side -----------------------------------------------------------------------
    def allocate(self, seq: Sequence) -> Allocation | None:
        t = self.transfers.get(seq.id)
        if t is None or not t.prefetched:
            return None
        kv = self.kv
        assert kv is not None, "RemoteConnector.bind() was not called"
        if t.source is None:
            return kv.allocate(seq.id)  # the prefetch ships the whole prompt: no lookup, no copy
        alloc = kv.allocate_from(seq.id, t.source, t.start)
        t.source = None  # the pin now belongs to the allocation, which the batcher unpins after the copy
        return alloc

    def poll(self, seq: Sequence) -> LoadedKV | None:
        t = self.transfers.get(seq.id)
        if t is None:
            slot = self._reserve(seq.id)
            if slot is None:
                return None  # every slot is busy: try again next step
            t = self._start(seq.id, seq.prompt, seq.computed, slot, seq.params.prompt_logprobs)
        if not t.future.done():
            return None
        del self.transfers[seq.id]
        try:
            ship: Shipment = t.future.result()  # raises the fetch's error
        except BaseException:
            self._release(seq.id, t, ok=False)
            raise
        self._imports[seq.id] = (t, ship)
        return LoadedKV(ship.start, ship.token_ids, ship.k, ship.v, ship.logits, ship.prompt_logprobs,
                        ship.payload_bytes)

    def release(self, seq: Sequence, ok: bool) -> None:
        t, ship = self._imports.pop(seq.id)
        if ok:
            self.counters.remote_prefill_tokens += len(ship.token_ids)
            self.counters.kv_bytes_imported += ship.payload_bytes
        self._release(seq.id, t, ok=ok)

    def _release(self, request_id: str, t: Transfer, *, ok: bool) -> None:
        if t.prefetched:
            if ok:
                self.counters.prefetch_hits += 1
            else:
                self.counters.prefetch_failed += 1
        self._let_go(request_id, t)  # the slot is free only now, after the import

    def request_finished(self, seq: Sequence, reason: FinishReason) -> None:
        t = self.transfers.pop(seq.id, None)
        if t is None:
            return
        # Ended before its import: the fetch is cancelled and the slot is free once it stopped.
        assert t.fetch is not None
        if t.source is not None:
            assert self.kv is not None
            self.kv.unpin(t.source)
            t.source = None
        if t.prefetched:
            if reason is FinishReason.CANCELLED:
                self.counters.prefetch_cancelled += 1
            else:
                self.counters.prefetch_failed += 1
        t.fetch.cancel()  # closes its connection: the worker stops computing or sending it
        self._let_go(seq.id, t)  # the slot waits for the producer to stop writing into it

    def after_step(self, lanes: list[Sequence | None], next_waiting: Sequence | None) -> None:
        """B1: ship the head of the queue while every lane decodes, one prefetch at a time."""
        if not self.prefetch_next or next_waiting is None:
            return
        if any(s is None or s.status is not Status.DECODE for s in lanes):
            return
        with self._slot_lock:
            if self.prefetch_id is not None:
                return
        head = next_waiting
        if head.id in self.transfers:
            return
        slot = self._reserve(head.id)
        if slot is None:
            return
        assert self.kv is not None, "RemoteConnector.bind() was not called"
        pinned = self.kv.pin_prefix(head.cacheable_prompt)
        source, start = pinned if pinned is not None else (None, 0)
        with self._slot_lock:
            self.prefetch_id = head.id
        self._start(head.id, head.prompt, start, slot, head.params.prompt_logprobs, prefetched=True, source=source)
        self.counters.prefetch_started += 1
        self.counters.prefetch_cached_tokens += start
        log.info("event=prefetch_started request_id=%s cached_tokens=%d", head.id, start)
