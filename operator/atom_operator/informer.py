"""Informers, as client-go has them: list, then watch; list again after every break and every resync period.

A watch reports only what happens while it is connected: an object deleted while the operator was cut off from
the API server (an outage, a control-plane upgrade) sends no event, ever. So every listing is handed over whole
(:meth:`Sink.relisted`), and the receiver compares it with what it knows: what it knows and the listing lacks
was deleted meanwhile. A listing happens at start, after every broken or expired watch, and at least every
``resync_seconds`` (the watch is asked to end then), so nothing stays missed for longer than that.

Each informer has a cheap filter (``owner_of``): the AtomDeployment an object belongs to, or None for an object
that is not ours, which is dropped at once. Children are watched unfiltered on the server and matched by their
controller owner reference, not by a label someone can remove; an object that stops matching (a hand edit took
its owner reference) is reported as deleted, as the API server does for an object that leaves a label selector.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from atom_operator import telemetry
from atom_operator.kube import Kube, KubeError, TransientError
from atom_operator.store import trimmed

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, AtomDeployment name)
OwnerOf = Callable[[dict[str, Any]], Key | None]
RELIST_BACKOFF_MIN, RELIST_BACKOFF_MAX = 0.5, 5.0  # a broken watch's relist delays


@dataclass(frozen=True)
class Listing:
    """One complete listing of ``kind`` in ``namespace`` (None: every namespace) as of ``resource_version``."""

    kind: str
    namespace: str | None
    items: list[tuple[dict[str, Any], Key]]  # (object, its owner's key)
    resource_version: str  # opaque, as the API server gave it (see atom_operator.cache.compare_versions)


class Sink(Protocol):
    def relisted(self, listing: Listing) -> None: ...

    def event(self, kind: str, type_: str | None, body: dict[str, Any], key: Key) -> None: ...


class Informer:
    def __init__(
        self,
        kube: Kube,
        kind: str,
        namespace: str | None,
        owner_of: OwnerOf,
        sink: Sink,
        resync_seconds: int,
        label_selector: str | None = None,
    ) -> None:
        self.kube, self.kind, self.namespace, self.owner_of, self.sink = kube, kind, namespace, owner_of, sink
        self.resync_seconds, self.label_selector = resync_seconds, label_selector
        self.synced = asyncio.Event()  # set after the first complete listing, and stays set
        self._owners: dict[tuple[str, str], Key] = {}  # (namespace, name) of every object passed on -> its owner

    def __repr__(self) -> str:
        return f"Informer({self.kind}, {self.namespace or '*'})"

    async def run(self) -> None:
        delay = RELIST_BACKOFF_MIN
        while True:
            try:
                version = await self._list()
                delay = RELIST_BACKOFF_MIN
                started = time.monotonic()
                await self._watch(version)
                if time.monotonic() - started < 1:
                    # Ended at once without an error (a proxy closing it, say): list again, but not in a tight loop.
                    raise TransientError("the watch ended as soon as it began")
            except asyncio.CancelledError:
                raise
            except (TransientError, KubeError) as e:
                log.warning("informer=%s event=watch_broken retry_in=%.1fs error=%s", self, delay, e)
            except Exception:
                log.exception("informer=%s event=watch_failed retry_in=%.1fs", self, delay)
            else:
                continue  # the watch ended as asked (resync) or expired: list again at once
            # Jittered, so informers (and operators) do not reconnect in lockstep after an outage.
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(RELIST_BACKOFF_MAX, delay * 2)

    async def _list(self) -> str:
        items, version = await self.kube.list(self.kind, self.namespace, self.label_selector, keep=self._keep)
        mine = [(item, key) for item in items if (key := self.owner_of(item)) is not None]
        self._owners = {(b["metadata"].get("namespace", ""), b["metadata"]["name"]): key for b, key in mine}
        self.sink.relisted(Listing(self.kind, self.namespace, mine, version))
        telemetry.RELISTS.labels(self.kind).inc()
        if not self.synced.is_set():
            log.info("informer=%s event=synced objects=%d", self, len(mine))
        self.synced.set()
        return version

    def _keep(self, item: dict[str, Any]) -> dict[str, Any] | None:
        # Only ours, and without the managedFields no store keeps: a listing is the operator's largest allocation.
        return trimmed(item) if self.owner_of(item) is not None else None

    async def _watch(self, version: str) -> None:
        # The server ends the watch after resync_seconds (jittered, so the informers spread their relists).
        timeout = max(1, int(self.resync_seconds * random.uniform(0.9, 1.0)))
        try:
            async for event in self.kube.watch(self.kind, self.namespace, version, timeout, self.label_selector):
                self._deliver(event.get("type"), event.get("object") or {})
        except KubeError as e:
            if e.status != 410:
                raise
            # 410 Gone: the version is too old to watch from; a new listing starts over
            log.info("informer=%s event=watch_expired status=%s", self, e.status)

    def _deliver(self, type_: str | None, body: dict[str, Any]) -> None:
        if type_ == "BOOKMARK":
            return
        body.setdefault("kind", self.kind)
        ref = (body["metadata"].get("namespace", ""), body["metadata"]["name"])
        key = self.owner_of(body)
        if key is None:
            key = self._owners.pop(ref, None)
            if key is None:
                return  # not ours, never was
            type_ = "DELETED"  # no longer ours: to the receiver it is gone
        elif type_ == "DELETED":
            self._owners.pop(ref, None)
        else:
            self._owners[ref] = key
        self.sink.event(self.kind, type_, body, key)


# ---- the filters -----------------------------------------------------------------------------------------------
def itself(body: dict[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


def controlled_by(kind: str, api_group: str) -> OwnerOf:
    """The owner of a child: its controller reference to a ``kind`` of ``api_group`` (never a label)."""

    def owner_of(body: dict[str, Any]) -> Key | None:
        for ref in body["metadata"].get("ownerReferences") or []:
            if (
                ref.get("controller")
                and ref.get("kind") == kind
                and str(ref.get("apiVersion", "")).split("/")[0] == api_group
            ):
                return body["metadata"]["namespace"], ref["name"]
        return None

    return owner_of


def labelled(label: str) -> OwnerOf:
    """The owner of a pod: the label its Deployment's template gives it (pods are the ReplicaSet's, not ours)."""

    def owner_of(body: dict[str, Any]) -> Key | None:
        owner = (body["metadata"].get("labels") or {}).get(label)
        return (body["metadata"]["namespace"], owner) if owner else None

    return owner_of
