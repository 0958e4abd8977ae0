"""KV blocks: conservation, scratch, prefix lookup, pinning and exact LRU; unit cases and a hypothesis state machine."""

from __future__ import annotations

import pytest
from atom_engine import limits
from atom_engine.kv_blocks import SCRATCH_BLOCK, KVBlocks, NoKVBlockAvailable, SourceSlots
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule


def test_fresh_blocks_are_free_except_scratch() -> None:
    kv = KVBlocks(5, prefix_cache=True)
    assert kv.counts() == {"free": 4, "lanes": 0, "cached": 0, "scratch": 1}
    assert SCRATCH_BLOCK not in kv.free
    kv.check_invariant()


def test_scratch_is_never_handed_out() -> None:
    kv = KVBlocks(3, prefix_cache=False)
    got = {kv.allocate("a").block, kv.allocate("b").block}
    assert SCRATCH_BLOCK not in got
    with pytest.raises(NoKVBlockAvailable, match="no KV block available"):
        kv.allocate("c")
    kv.check_invariant()


def test_without_prefix_cache_a_finished_block_is_freed() -> None:
    kv = KVBlocks(2, prefix_cache=False)
    a = kv.allocate("a", [1, 2, 3])
    kv.release("a", [1, 2, 3, 4])
    assert kv.counts()["cached"] == 0 and list(kv.free) == [a.block]
    assert kv.allocate("b", [1, 2, 3]).source is None
    kv.check_invariant()


def test_finished_block_becomes_cache_entry_and_prefix_hit_copies_from_it() -> None:
    kv = KVBlocks(4, prefix_cache=True)
    a = kv.allocate("a", [1, 2, 3])
    kv.release("a", [1, 2, 3, 9])
    b = kv.allocate("b", [1, 2, 3, 9, 7])
    assert (b.source, b.cached_len) == (a.block, 4)
    assert b.block != a.block and kv.pins == {a.block: 1}
    kv.unpin(b.source)
    assert kv.pins == {} and kv.cached_blocks() == [a.block]  # the entry stays cached
    kv.check_invariant()


def test_hit_reuses_at_most_all_but_the_last_prompt_token() -> None:
    kv = KVBlocks(4, prefix_cache=True)
    kv.allocate("a", [1, 2, 3])
    kv.release("a", [1, 2, 3])
    assert kv.allocate("b", [1, 2, 3]).cached_len == 2  # the last token must be computed for its logits


def test_longest_common_prefix_wins_and_ties_go_to_the_most_recent() -> None:
    kv = KVBlocks(6, prefix_cache=True)
    for owner, toks in [("a", [1, 2, 5]), ("b", [1, 2, 3, 4]), ("c", [1, 2, 3, 7])]:
        kv.allocate(owner, toks)
        kv.release(owner, toks)
    b_block, c_block = kv.cache[(1, 2, 3, 4)], kv.cache[(1, 2, 3, 7)]
    assert kv.lookup([1, 2, 3, 4, 0]) == ((1, 2, 3, 4), 4)
    assert kv.lookup([1, 2, 3, 0]) == ((1, 2, 3, 7), 3)  # b and c tie at 3: c is more recent
    hit = kv.allocate("d", [1, 2, 3, 4, 0])
    assert hit.source == b_block != c_block


def test_eviction_is_least_recently_used_and_a_hit_counts_as_use() -> None:
    kv = KVBlocks(5, prefix_cache=True)  # 4 usable blocks
    for owner, toks in [("a", [1]), ("b", [2]), ("c", [3]), ("d", [4])]:
        kv.allocate(owner, toks)
        kv.release(owner, toks)
    order = kv.cached_blocks()
    hit = kv.allocate("e", [2, 9])  # touches [2]; takes the LRU entry [1]
    assert hit.source == order[1] and hit.block == order[0]
    kv.unpin(hit.source)
    assert kv.cached_blocks() == [order[2], order[3], order[1]]
    kv.check_invariant()


def test_copy_source_is_never_evicted_even_when_it_is_the_lru_entry() -> None:
    lanes = 2
    kv = KVBlocks(limits.min_kv_blocks(lanes, prefix_cache=True), prefix_cache=True)  # 4: scratch + 3
    for owner, toks in [("a", [1, 1]), ("b", [2, 2]), ("c", [3, 3])]:
        kv.allocate(owner, toks)
        kv.release(owner, toks)
    kv.allocate("x", [7])  # evicts [1, 1]; now [2,2], [3,3] cached, one lane busy (lanes - 1)
    lru_key = next(iter(kv.cache))
    hit = kv.allocate("y", [*lru_key, 5])  # the LRU entry is the source: the other entry is evicted
    assert hit.source == kv.cache[lru_key] and hit.block != hit.source
    kv.check_invariant()


def test_lanes_plus_one_with_prefix_cache_finds_no_victim() -> None:
    """The bug class the block rule removes: with kvBlocks = lanes + 1 the copy source is the only victim."""
    kv = KVBlocks(3, prefix_cache=True)  # lanes=2 would need 4
    kv.allocate("a", [1, 2])
    kv.release("a", [1, 2])
    kv.allocate("b", [5])
    with pytest.raises(NoKVBlockAvailable, match="no KV block available"):
        kv.allocate("c", [1, 2, 3])
    assert kv.pins == {}  # the failed allocation left nothing pinned
    kv.check_invariant()


def test_same_tokens_cached_twice_keep_one_entry() -> None:
    kv = KVBlocks(4, prefix_cache=True)
    kv.allocate("a", [1, 2])
    kv.allocate("b", [1, 2])  # both admitted before either finished: no hit
    kv.release("a", [1, 2, 3])
    kv.release("b", [1, 2, 3])
    assert len(kv.cache) == 1 and len(kv.free) == 2
    kv.check_invariant()


def test_release_without_tokens_frees_the_block() -> None:
    kv = KVBlocks(4, prefix_cache=True)
    a = kv.allocate("a", [1, 2])
    kv.release("a", None)
    assert a.block in kv.free and not kv.cache


def test_owner_cannot_hold_two_blocks() -> None:
    kv = KVBlocks(4, prefix_cache=False)
    kv.allocate("a")
    with pytest.raises(ValueError, match="already holds"):
        kv.allocate("a")


def test_invariant_catches_a_lost_block() -> None:
    kv = KVBlocks(4, prefix_cache=False)
    kv.free.pop()
    with pytest.raises(AssertionError, match="conservation"):
        kv.check_invariant()


def test_source_slots_reserve_and_release() -> None:
    slots = SourceSlots(1)
    assert slots.reserve("a") == 0
    assert slots.reserve("a") == 0  # idempotent for the same owner
    assert slots.reserve("b") is None
    slots.release("a")
    assert slots.reserve("b") == 0 and slots.held() == 1


class KVBlocksMachine(RuleBasedStateMachine):
    """Random admit / copy / finish / cancel / fail sequences against a reference model of the LRU and lookup.

    Copies may stay in flight across other admissions (more than the batcher ever does), so the copy source is
    often the LRU entry when a block is taken.
    """

    @initialize(lanes=st.integers(1, 4), extra=st.integers(0, 3))
    def build(self, lanes: int, extra: int) -> None:
        self.lanes = lanes
        self.kv = KVBlocks(limits.min_kv_blocks(lanes, prefix_cache=True) + extra, prefix_cache=True)
        self.lru: list[tuple[int, ...]] = []  # the model's recency order, least recent first
        self.owners: dict[str, list[int]] = {}
        self.pending: list[tuple[int, tuple[int, ...]]] = []  # copies in flight: (source block, its key)
        self.n = 0

    @precondition(lambda self: len(self.owners) < self.lanes)
    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    def admit(self, prompt: list[int]) -> None:
        kv = self.kv
        expected = None
        for key in reversed(self.lru):
            cp = 0
            while cp < min(len(key), len(prompt)) and key[cp] == prompt[cp]:
                cp += 1
            n = min(cp, len(prompt) - 1)
            if n > 0 and (expected is None or n > expected[1]):
                expected = (key, n)
        pinned = {k for _, k in self.pending} | ({expected[0]} if expected else set())
        owner = f"r{self.n}"
        self.n += 1
        victim = None
        if not kv.free:
            victim = next((k for k in self.lru if k not in pinned), None)
            if victim is None:
                with pytest.raises(NoKVBlockAvailable):
                    kv.allocate(owner, prompt)
                return
        alloc = kv.allocate(owner, prompt)
        if victim is not None:
            self.lru.remove(victim)
            assert victim not in kv.cache
        if expected is None:
            assert alloc.source is None
        else:
            assert (alloc.cached_len, alloc.source) == (expected[1], kv.cache[expected[0]])
            self.lru.remove(expected[0])
            self.lru.append(expected[0])
            self.pending.append((alloc.source, expected[0]))
        self.owners[owner] = list(prompt)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def copy_done(self, data: st.DataObject) -> None:
        source, _ = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        self.kv.unpin(source)

    @precondition(lambda self: self.owners)
    @rule(
        data=st.data(), how=st.sampled_from(["finish", "cancel", "fail"]), gen=st.lists(st.integers(0, 2), max_size=3)
    )
    def end(self, data: st.DataObject, how: str, gen: list[int]) -> None:
        owner = data.draw(st.sampled_from(sorted(self.owners)))
        tokens = self.owners.pop(owner) + gen
        if how == "cancel":
            tokens = tokens[: data.draw(st.integers(0, len(tokens)))]
        self.kv.release(owner, None if how == "fail" else tokens)
        key = tuple(tokens)
        if how != "fail" and key:
            if key in self.lru:
                self.lru.remove(key)
            self.lru.append(key)

    @invariant()
    def conserved_and_lru_exact(self) -> None:
        self.kv.check_invariant()
        assert list(self.kv.cache) == self.lru
        for source, key in self.pending:
            assert self.kv.cache.get(key) == source  # a copy source is never evicted


TestKVBlocksMachine = KVBlocksMachine.TestCase
TestKVBlocksMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def scan(cache: list[tuple[int, ...]], tokens: list[int]) -> tuple[tuple[int, ...], int] | None:
    """The lookup as a scan of every entry, most recent first (what the index replaces)."""
    best = None
    for key in reversed(cache):
        n = 0
        while n < min(len(key), len(tokens) - 1) and key[n] == tokens[n]:
            n += 1
        if n > 0 and (best is None or n > best[1]):
            best = (key, n)
    return best


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=150), st.booleans()), max_size=60))
def test_prefix_index_finds_what_a_scan_of_every_entry_finds(ops: list[tuple[list[int], bool]]) -> None:
    """Long prompts sharing long prefixes, entries evicted and cached again: the same entry and length as a scan
    (the most recent on a tie), and the index keeps exactly the cache's keys."""
    kv = KVBlocks(12, prefix_cache=True)
    for i, (prompt, finish_longer) in enumerate(ops):
        assert kv.lookup(prompt) == scan(list(kv.cache), prompt)
        alloc = kv.allocate(f"r{i}", prompt)
        if alloc.source is not None:
            kv.unpin(alloc.source)
        kv.release(f"r{i}", prompt + [1, 2] if finish_longer else prompt)
        kv.check_invariant()
