"""The controller's work queue: keys of AtomDeployments to reconcile.

As client-go's workqueue: a key is pending at most once however many events name it, and never handed to two
workers at once (a key that changes while it is reconciled is handed out again when that reconcile ends). As
controller-runtime's priority queue: what a user asked for (a new AtomDeployment, a new spec, a child deleted or
a scale decision) goes before what only refreshes status (a child's or a pod's status changed, a resync, a timer),
so a burst of pods becoming Ready does not hold up the children of an object just created.
"""

from __future__ import annotations

import asyncio
import itertools

from atom_operator.store import Key

URGENT, ROUTINE = 0, 1  # lower goes first


class WorkQueue:
    def __init__(self) -> None:
        self._entries: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self._order = itertools.count()  # first in, first out within a priority
        self._pending: dict[Key, int] = {}  # key -> the priority it waits at
        self._running: set[Key] = set()

    def add(self, key: Key, priority: int = URGENT) -> None:
        waiting = self._pending.get(key)
        if waiting is not None and waiting <= priority:
            return
        self._pending[key] = priority
        if key not in self._running:
            self._entries.put_nowait((priority, next(self._order), key))
        # Raising a waiting key's priority leaves its older entry behind; get() skips it.

    async def get(self) -> Key:
        """The next key to reconcile; the caller calls :meth:`done` with it when the reconcile ends."""
        while True:
            priority, _, key = await self._entries.get()
            if self._pending.get(key) == priority and key not in self._running:
                del self._pending[key]
                self._running.add(key)
                return key

    def done(self, key: Key) -> None:
        self._running.discard(key)
        priority = self._pending.get(key)
        if priority is not None:  # events arrived while it ran: go again
            self._entries.put_nowait((priority, next(self._order), key))

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._pending
