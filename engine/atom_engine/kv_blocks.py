"""KV blocks: which whole-sequence KV block belongs to whom. Pure Python: no torch, no HTTP.

Every block is in exactly one place: the scratch block (pads empty lanes of the static decode batch), the free
deque, a lane (its owner holds exactly one block), or the prefix cache (an LRU map from the tokens whose KV the
block holds to the block id, indexed by :class:`PrefixIndex`). A cache entry that a lane is copying from is
*pinned*: allocating a block never evicts it. See docs/design.md, "KV blocks" to "Conservation".
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from atom_engine.prefix_index import PrefixIndex

SCRATCH_BLOCK = 0


class NoKVBlockAvailable(RuntimeError):
    """No free block and no evictable cache entry; the block rule (limits.min_kv_blocks) rules this out."""


@dataclass(frozen=True)
class Allocation:
    """A lane's new block and, on a prefix-cache hit, the entry to copy its first ``cached_len`` tokens from.

    ``source`` stays pinned until :meth:`KVBlocks.unpin` is called (after the runner copied it).
    """

    block: int
    source: int | None = None
    cached_len: int = 0


class KVBlocks:
    """The block table of one engine: ``kv_blocks`` blocks, one scratch, lanes, free and cached blocks."""

    def __init__(self, kv_blocks: int, *, prefix_cache: bool) -> None:
        if kv_blocks < 2:
            raise ValueError(f"kv_blocks must be >= 2 (one scratch block and one lane); got {kv_blocks}")
        self.kv_blocks = kv_blocks
        self.prefix_cache = prefix_cache
        self.scratch = SCRATCH_BLOCK
        self.free: deque[int] = deque(b for b in range(kv_blocks) if b != SCRATCH_BLOCK)
        self.lanes: dict[Hashable, int] = {}  # owner (a request id) -> its block
        self.cache: OrderedDict[tuple[int, ...], int] = OrderedDict()  # least recently used first
        self.index = PrefixIndex()  # the cache's keys, for lookup; same keys, same recency order
        self.pins: dict[int, int] = {}  # cached block -> number of copies in flight from it
        self.queries = 0
        self.hits = 0
        self.hit_tokens = 0

    # -- queries ---------------------------------------------------------------------------------
    def lookup(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], int] | None:
        """The entry sharing the longest prefix with ``tokens`` (most recent on a tie) and that length.

        At most ``len(tokens) - 1`` tokens are reused: the last prompt token must be computed to get logits.
        """
        return self.index.longest(tokens, len(tokens) - 1)

    def cached_blocks(self) -> list[int]:
        """Cached blocks, least recently used first (the eviction order)."""
        return list(self.cache.values())

    # -- operations ------------------------------------------------------------------------------
    def allocate(self, owner: Hashable, prompt: Sequence[int] = ()) -> Allocation:
        """Give ``owner`` a block; with a prefix cache, find the entry to copy ``prompt``'s prefix from.

        The entry found is pinned before the block is taken, so taking the block never evicts it.
        """
        if owner in self.lanes:
            raise ValueError(f"{owner!r} already holds block {self.lanes[owner]}")
        hit = None
        if self.prefix_cache and prompt:
            self.queries += 1
            hit = self.lookup(prompt)
        if hit is None:
            self.lanes[owner] = self._take()
            return Allocation(self.lanes[owner])
        key, n = hit
        source = self.cache[key]
        self.pins[source] = self.pins.get(source, 0) + 1
        try:
            block = self._take()  # the source may be the LRU entry: the pin keeps it
        except NoKVBlockAvailable:
            self.unpin(source)
            raise
        self._touch(key)  # a hit is a use
        self.lanes[owner] = block
        self.hits += 1
        self.hit_tokens += n
        return Allocation(block, source, n)

    def pin_prefix(self, tokens: Sequence[int]) -> tuple[int, int] | None:
        """Pin the entry sharing the longest prefix with ``tokens``: (its block, the shared length), or None.

        For B1 prefetch: the prefill worker ships only the tokens after the prefix, so the entry must survive
        until the lane imports; the caller copies from it with :meth:`allocate_from` or gives it back with
        :meth:`unpin`. Counts as a prefix-cache query (and a hit when found), as :meth:`allocate` does.
        """
        if not self.prefix_cache or not tokens:
            return None
        self.queries += 1
        hit = self.lookup(tokens)
        if hit is None:
            return None
        key, n = hit
        source = self.cache[key]
        self.pins[source] = self.pins.get(source, 0) + 1
        self._touch(key)
        self.hits += 1
        self.hit_tokens += n
        return source, n

    def allocate_from(self, owner: Hashable, source: int, cached_len: int) -> Allocation:
        """A block for ``owner`` that copies from ``source``, an entry pinned earlier by :meth:`pin_prefix`.

        The pin passes to the returned allocation: the caller unpins after the copy, as after :meth:`allocate`.
        """
        if owner in self.lanes:
            raise ValueError(f"{owner!r} already holds block {self.lanes[owner]}")
        if source not in self.pins:
            raise ValueError(f"block {source} is not a pinned cache entry")
        self.lanes[owner] = self._take()  # the pin keeps the source
        return Allocation(self.lanes[owner], source, cached_len)

    def unpin(self, source: int) -> None:
        """The copy from ``source`` is done (or abandoned): it may be evicted again."""
        left = self.pins[source] - 1
        if left:
            self.pins[source] = left
        else:
            del self.pins[source]

    def release(self, owner: Hashable, tokens: Sequence[int] | None = None) -> None:
        """``owner`` is done with its block: cache it under ``tokens`` (whose KV it holds) or free it."""
        block = self.lanes.pop(owner)
        key = tuple(tokens) if tokens else ()
        if not self.prefix_cache or not key:
            self.free.append(block)
            return
        if key in self.cache:  # same tokens already cached: keep one copy, refresh its recency
            self._touch(key)
            self.free.append(block)
            return
        self.cache[key] = block
        self.index.add(key)

    def _touch(self, key: tuple[int, ...]) -> None:
        self.cache.move_to_end(key)
        self.index.touch(key)

    def _take(self) -> int:
        if self.free:
            return self.free.popleft()
        for key, block in self.cache.items():  # least recently used first
            if block not in self.pins:
                del self.cache[key]
                self.index.remove(key)
                return block
        raise NoKVBlockAvailable(
            f"no KV block available: {len(self.lanes)} held by lanes, {len(self.cache)} cached and pinned,"
            f" 1 scratch, of kvBlocks={self.kv_blocks}"
        )

    # -- accounting ------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        return {"free": len(self.free), "lanes": len(self.lanes), "cached": len(self.cache), "scratch": 1}

    def stats(self) -> dict[str, float]:
        """Where the blocks are, the share held by lanes (scratch excluded), and the prefix cache's counters."""
        return {"kv_blocks": self.kv_blocks, "free_blocks": len(self.free), "lane_blocks": len(self.lanes),
                "cached_blocks": len(self.cache), "pinned_blocks": len(self.pins),
                "kv_usage": len(self.lanes) / max(1, self.kv_blocks - 1), "prefix_cache_queries": self.queries,
                "prefix_cache_hits": self.hits, "prefix_cache_hit_tokens": self.hit_tokens}

    def check_invariant(self) -> None:
        """free + lanes + cached + scratch == kv_blocks, every block in exactly one place, pins on entries."""
        places = [*self.free, *self.lanes.values(), *self.cache.values(), self.scratch]
        if len(places) != self.kv_blocks or set(places) != set(range(self.kv_blocks)):
            raise AssertionError(f"KV block conservation broken: {self.counts()} over kvBlocks={self.kv_blocks}")
        cached = set(self.cache.values())
        if any(b not in cached or n <= 0 for b, n in self.pins.items()):
            raise AssertionError(f"a pinned block is not a cache entry: pins={self.pins}")
        if len(self.index) != len(self.cache) or self.index.keys() != set(self.cache):
            raise AssertionError("the prefix index and the cache hold different keys")


class SourceSlots:
    """Staging slots for KV computed elsewhere (PD disaggregation): a prefill worker ships a prompt's KV into a
    reserved slot and the decode side imports it into the lane's block. Slots are not KV blocks: they live
    outside the ``kvBlocks`` compiled into the graphs, so the block rule is unchanged.
    """

    def __init__(self, capacity: int = 1) -> None:
        self.capacity = capacity
        self.holders: dict[Hashable, int] = {}

    def reserve(self, owner: Hashable) -> int | None:
        """A slot for ``owner``, or None when all are held (the caller waits and tries again)."""
        if owner in self.holders:
            return self.holders[owner]
        used = set(self.holders.values())
        for slot in range(self.capacity):
            if slot not in used:
                self.holders[owner] = slot
                return slot
        return None

    def release(self, owner: Hashable) -> None:
        """Give the slot back (after the import, or after a cancelled transfer's producer completed)."""
        self.holders.pop(owner, None)

    def held(self) -> int:
        return len(self.holders)
