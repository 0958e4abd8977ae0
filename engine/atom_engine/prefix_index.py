"""An index of the prefix cache's keys: a radix tree over token sequences. Pure Python: no torch.

The prefix cache looks up the entry sharing the longest prefix with a prompt. Scanning every entry token by token
costs entries x prompt length per admission; the tree walks the prompt once (edges compared a slice at a time),
and only the entries below the deepest point reached are candidates, the most recently used of which wins.

Every key ends at a node (never inside an edge), so "the keys below a point of the tree" are exactly the keys
that share the path to that point, whether the walk stops at a node or inside the edge leading to one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

Key = tuple[int, ...]
COMPARE_PIECE = 64  # edge tokens compared per slice; only the piece with the mismatch is walked token by token


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` (both tuples, or both lists) share."""
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(i + COMPARE_PIECE, n)
        if a[i:j] != b[i:j]:
            break
        i = j
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _Node:
    __slots__ = ("edge", "children", "keys", "ends")

    def __init__(self, edge: Key) -> None:
        self.edge = edge  # the tokens from the parent to this node
        self.children: dict[int, _Node] = {}  # by the first token of the child's edge
        self.keys: set[int] = set()  # the entry numbers of every key ending at or below this node
        self.ends = False  # a key ends exactly here


class PrefixIndex:
    """Keys (token tuples) with a recency each; :meth:`longest` finds the key sharing the longest prefix."""

    def __init__(self) -> None:
        self.root = _Node(())
        # Keys are numbered: nodes hold numbers, not long tuples whose hash is the length of the key.
        self._number: dict[Key, int] = {}
        self._key: dict[int, Key] = {}
        self._used: dict[int, int] = {}  # entry number -> when it was last used (larger: more recent)
        self._clock = itertools.count()
        self._numbers = itertools.count()

    def __len__(self) -> int:
        return len(self._number)

    def keys(self) -> set[Key]:
        return set(self._number)

    def touch(self, key: Key) -> None:
        """``key`` was used now (a hit, or cached again)."""
        self._used[self._number[key]] = next(self._clock)

    def add(self, key: Key) -> None:
        if key in self._number:
            self.touch(key)
            return
        entry = self._number[key] = next(self._numbers)
        self._key[entry] = key
        self.touch(key)
        node, depth = self.root, 0
        node.keys.add(entry)
        while depth < len(key):
            child = node.children.get(key[depth])
            if child is None:
                leaf = _Node(key[depth:])
                node.children[key[depth]] = leaf
                node = leaf
                depth = len(key)
                node.keys.add(entry)
                break
            n = common_prefix_len(child.edge, key[depth : depth + len(child.edge)])
            if n < len(child.edge):  # the key leaves (or ends inside) this edge: split it there
                child = self._split(node, child, n)
            node, depth = child, depth + n
            node.keys.add(entry)
        node.ends = True

    @staticmethod
    def _split(parent: _Node, child: _Node, at: int) -> _Node:
        middle = _Node(child.edge[:at])
        middle.keys = set(child.keys)
        child.edge = child.edge[at:]
        middle.children[child.edge[0]] = child
        parent.children[middle.edge[0]] = middle
        return middle

    def remove(self, key: Key) -> None:
        entry = self._number.pop(key)
        del self._key[entry], self._used[entry]
        path, node, depth = [self.root], self.root, 0
        while depth < len(key):
            node = node.children[key[depth]]
            depth += len(node.edge)
            path.append(node)
        node.ends = False
        for n in path:
            n.keys.discard(entry)
        for parent, n in zip(reversed(path[:-1]), reversed(path[1:]), strict=True):
            if not n.keys:  # nothing below any more
                del parent.children[n.edge[0]]
            elif not n.ends and len(n.children) == 1:  # a split point no key needs: merge it with its child
                (only,) = n.children.values()
                only.edge = n.edge + only.edge
                parent.children[only.edge[0]] = only

    def longest(self, tokens: Sequence[int], limit: int) -> tuple[Key, int] | None:
        """The key sharing the longest prefix with ``tokens`` (at most ``limit`` tokens counted; the most
        recently used on a tie) and that length; None when no key shares a first token."""
        query = tuple(tokens[:limit])
        node, depth = self.root, 0
        below = self.root  # the node whose keys all share ``depth`` tokens with the query
        while depth < len(query):
            child = node.children.get(query[depth])
            if child is None:
                break
            n = common_prefix_len(child.edge, query[depth : depth + len(child.edge)])
            depth += n
            below = child
            if n < len(child.edge):  # the walk ends inside this edge
                break
            node = child
        if depth == 0:
            return None
        best = max(below.keys, key=self._used.__getitem__)
        return self._key[best], depth
