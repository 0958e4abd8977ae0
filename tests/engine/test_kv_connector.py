"""The batcher with a KV connector (PD's seam) against a fake runner and a fake connector: the prompt's KV comes
from the connector, never from a local prefill; the connector is told what to ship (after the cached prefix),
when its KV was imported, and when a request ended first; a failed transfer fails that request only."""

from __future__ import annotations

from atom_engine import limits
from atom_engine.batcher import Batcher
from atom_engine.errors import KVUnavailable
from atom_engine.kv_blocks import Allocation, KVBlocks
from atom_engine.kv_connector import LoadedKV
from atom_engine.sequence import FinishReason, SamplingParams, Sequence

from tests.engine.fake_runner import FakeRunner, next_token, reference
from tests.engine.test_batcher import run

MAX_SEQ = 64


class ImportingRunner(FakeRunner):
    def prefill(self, seq: Sequence, start: int, tokens: list[int], last: bool) -> int | None:
        raise AssertionError("a batcher with a KV connector never prefills")

    def load_kv(self, seq: Sequence, loaded: LoadedKV) -> int:
        for i, t in enumerate(loaded.token_ids):
            self.blocks[seq.block][loaded.start + i] = t
        return next_token(self._read(seq.block, loaded.start + len(loaded.token_ids)))


class ShippingConnector:
    """Ships a prompt's tokens ``delay`` polls after the lane first asks; fails the prompts in ``fail``."""

    def __init__(self, delay: int = 2, fail: tuple[int, ...] = ()) -> None:
        self.delay, self.fail = delay, fail
        self.asked: dict[str, int] = {}  # request id -> the start it was asked for
        self.polls: dict[str, int] = {}
        self.released: list[tuple[str, bool]] = []
        self.ended: list[tuple[str, FinishReason]] = []

    def ships(self, seq: Sequence) -> bool:
        return True

    def bind(self, kv: KVBlocks, model: object = None) -> None:
        self.kv = kv

    def set_wakeup(self, wakeup: object) -> None:
        pass

    def allocate(self, seq: Sequence) -> Allocation | None:
        return None

    def poll(self, seq: Sequence) -> LoadedKV | None:
        self.asked.setdefault(seq.id, seq.computed)
        self.polls[seq.id] = self.polls.get(seq.id, 0) + 1
        if self.polls[seq.id] <= self.delay:
            return None
        if seq.prompt[0] in self.fail:
            raise KVUnavailable("no prefill worker produced the KV")
        start = self.asked[seq.id]
        return LoadedKV(start, seq.prompt[start:], None, None, None)

    def release(self, seq: Sequence, ok: bool) -> None:
        self.released.append((seq.id, ok))

    def request_finished(self, seq: Sequence, reason: FinishReason) -> None:
        self.ended.append((seq.id, reason))

    def after_step(self, lanes: list[Sequence | None], next_waiting: Sequence | None) -> None:
        pass

    def busy(self) -> bool:
        return False

    def stats(self) -> dict[str, float]:
        return {}


def make(connector: ShippingConnector, lanes: int = 2) -> Batcher:
    kv_blocks = limits.min_kv_blocks(lanes, True)
    kv = KVBlocks(kv_blocks, prefix_cache=True)
    connector.bind(kv)
    return Batcher(ImportingRunner(kv_blocks, MAX_SEQ, lanes), kv, lanes=lanes, max_seq_len=MAX_SEQ,
                   prefill_chunk=4, connector=connector)


def test_prompt_kv_comes_from_the_connector_after_the_cached_prefix() -> None:
    conn = ShippingConnector()
    b = make(conn)
    first = b.add([1, 2, 3, 4, 5], SamplingParams(max_tokens=3))
    run(b, [first])
    second = b.add([1, 2, 3, 4, 9, 9], SamplingParams(max_tokens=3))  # shares 4 tokens with first's entry
    run(b, [second])
    assert first.output == reference([1, 2, 3, 4, 5], 3) and second.output == reference([1, 2, 3, 4, 9, 9], 3)
    assert conn.asked == {first.id: 0, second.id: 4} and second.cached_tokens == 4
    assert conn.released == [(first.id, True), (second.id, True)]
    assert b.counters["prefill_chunks"] == 0 and b.counters["prefill_tokens_computed"] == 0


def test_a_failed_transfer_fails_its_request_only() -> None:
    conn = ShippingConnector(fail=(7,))
    b = make(conn)
    bad, good = b.add([7, 1], SamplingParams(max_tokens=2)), b.add([8, 1], SamplingParams(max_tokens=2))
    run(b, [bad, good])
    assert bad.finish_reason is FinishReason.ERROR and isinstance(bad.failure, KVUnavailable)
    assert bad.error == "KVUnavailable: no prefill worker produced the KV"
    assert good.finish_reason == "length" and good.output == reference([8, 1], 2)
    assert b.kv.counts()["lanes"] == 0


def test_a_request_cancelled_while_its_kv_travels_tells_the_connector_and_frees_its_block() -> None:
    conn = ShippingConnector(delay=50)
    b = make(conn)
    s = b.add([5, 6, 7], SamplingParams(max_tokens=2))
    b.step()
    b.step()
    assert s.block is not None and conn.polls[s.id] == 2
    b.cancel(s.id)
    b.step()
    assert s.finish_reason is FinishReason.CANCELLED and conn.ended == [(s.id, FinishReason.CANCELLED)]
    assert conn.released == [] and b.kv.counts()["lanes"] == 0
    b.kv.check_invariant()
