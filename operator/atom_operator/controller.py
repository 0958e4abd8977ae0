"""The work queue: informer events mark AtomDeployments dirty, a few workers reconcile them one key at a time.

Like controller-runtime: an event only updates its kind's store (:mod:`atom_operator.store`) and enqueues the key of
the AtomDeployment it belongs to; the key carries nothing else, many events coalesce into one reconcile, a key is
never reconciled by two workers at once, failures retry with backoff, and no worker starts before every informer
has listed once and this replica may write (:attr:`Controller.writing`: it holds the lease). The echo of our own
write enqueues nothing; a listing that lacks something a store holds is a deletion no watch reported, repaired
like one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from atom_operator import deployment_metrics, events, routing, telemetry
from atom_operator.api import KIND
from atom_operator.children import Defaults
from atom_operator.informer import Listing
from atom_operator.kube import Kube, KubeError, TransientError
from atom_operator.reconcile import UNWATCHED, Context, reconcile
from atom_operator.status import Condition, PodView
from atom_operator.store import Key, Stores, newer, trimmed
from atom_operator.workqueue import ROUTINE, URGENT, WorkQueue

log = logging.getLogger(__name__)
RETRY_BACKOFF_MIN, RETRY_BACKOFF_MAX = 0.5, 30.0  # a failed reconcile's retry delays
EVENTS_FLUSH_SECONDS = 5.0  # on stop, how long the Events already recorded may take to go out

# What each store keeps of an object: pods only the little status reads of them, the rest without managedFields.
VIEWS: dict[str, Any] = {
    KIND: trimmed,
    **{kind: trimmed for kind in ("Deployment", "ConfigMap", "Service", "NetworkPolicy", "Job", *UNWATCHED)},
    "Pod": PodView.of,
}


class Controller:
    """The informers' sink (:class:`atom_operator.informer.Sink`) and the work queue behind it.

    Anything else that wants an AtomDeployment looked at (a timer, another watch) calls :meth:`enqueue` with its
    key; a reconcile that wants to be called again later says so in its outcome (``requeue_after``)."""

    def __init__(self, kube: Kube, defaults: Defaults, workers: int = 16) -> None:
        self.stores = Stores(VIEWS)
        self.context = Context(kube, defaults, self.stores, routing.Discovery(kube), events.Recorder(kube))
        self.queue = WorkQueue()
        self.published = deployment_metrics.Published()  # each AtomDeployment's status as metrics
        self._failures: dict[Key, int] = {}
        self._timers: dict[Key, asyncio.TimerHandle] = {}  # one requeue_after timer per key
        self.replicas: Callable[[Key], Mapping[str, int] | None] = lambda _key: None  # spec.autoscaling's counts
        self.scaling: Callable[[Key], Sequence[Condition] | None] = lambda _key: None  # and its conditions
        # Set once every informer has listed: until then a reconcile would see a partial world (no Deployment
        # status yet: "0 of 1 ready", a false Ready=False written on every restart; a child not listed yet:
        # created again). Events queue up meanwhile and are reconciled after.
        self.synced = asyncio.Event()
        # Set while this replica holds the lease (runtime.py): only the leader writes.
        self.writing = asyncio.Event()
        self._workers = [asyncio.create_task(self._work(), name=f"reconcile-{i}") for i in range(workers)]

    @property
    def defaults(self) -> Defaults:
        return self.context.defaults

    def alive(self) -> bool:
        return all(not t.done() for t in self._workers)

    async def stop_working(self) -> None:
        """Cancel the workers, and with them any reconcile in flight: nothing more is written."""
        self.writing.clear()
        for t in self._workers:
            t.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    async def stop(self) -> None:
        await self.stop_working()
        await self.context.events.flush(EVENTS_FLUSH_SECONDS)
        for timer in self._timers.values():
            timer.cancel()
        await self.context.kube.close()

    # ---- the informers' sink -----------------------------------------------------------------------------
    def event(self, kind: str, type_: str | None, body: dict[str, Any], key: Key) -> None:
        """A watch event (``type_`` None: an object of a listing)."""
        store, meta = self.stores[kind], body["metadata"]
        if type_ == "DELETED" or (kind == "Pod" and meta.get("deletionTimestamp")):
            if store.delete(meta["namespace"], meta["name"]) is not None:
                self._gone(kind, key)
            return
        if kind != KIND:
            if store.put(body, key):  # news, not our own write's echo
                self.enqueue(key, ROUTINE)
            return
        old = store.get(*key)
        if old is not None and newer(old, body):
            return  # our own status patch already stored something newer
        store.put(body, key)
        telemetry.OBJECTS.set(len(store))
        # Whoever wrote it (this reconcile, the autoscaler, another replica): the metrics follow the stored status.
        self.published.publish(key, body.get("status"))
        # A listing (start-up, a reconnect, a resync) reconciles everything; a watch event only a new spec (or a new
        # object of the same name): a status write is ours, or status only.
        old_meta = (old or {}).get("metadata", {})
        if type_ is None:
            self.enqueue(key, ROUTINE)
        elif (meta.get("generation"), meta["uid"]) != (old_meta.get("generation"), old_meta.get("uid")):
            self.enqueue(key, URGENT)

    def relisted(self, listing: Listing) -> None:
        """A complete listing: what a store holds and the listing lacks was deleted while no watch saw it (a
        tombstone); then every listed object, as a resync."""
        listed = {(b["metadata"]["namespace"], b["metadata"]["name"]) for b, _ in listing.items}
        gone = self.stores[listing.kind].tombstones(listing.namespace, listed, listing.resource_version)
        for entry in gone:
            self._gone(listing.kind, entry.owner)
        tombstones = len(gone)
        if tombstones:
            log.info("event=tombstones kind=%s count=%d", listing.kind, tombstones)
        if listing.kind == KIND:
            # A resync: what the stores of unwatched kinds hold (our writes' answers) is read again once.
            for kind in UNWATCHED:
                self.stores[kind].clear(listing.namespace)
        for body, key in listing.items:
            self.event(listing.kind, None, body, key)

    def _gone(self, kind: str, key: Key) -> None:
        if kind == KIND:
            self._failures.pop(key, None)
            telemetry.OBJECTS.set(len(self.stores[KIND]))
            self.published.forget(key)  # no stale series of a deleted AtomDeployment
        else:  # garbage collection after its owner, or a deletion to undo (a pod's: its ReplicaSet's to undo)
            self.enqueue(key, ROUTINE if kind == "Pod" else URGENT)

    # ---- the queue ---------------------------------------------------------------------------------------
    def enqueue(self, key: Key, priority: int = URGENT) -> None:
        """Reconcile ``key`` soon: :data:`~atom_operator.workqueue.URGENT` for what someone asked for (the
        default: a scale decision), ``ROUTINE`` for news that only refreshes status."""
        self.queue.add(key, priority)
        telemetry.QUEUE.set(len(self.queue))

    def enqueue_after(self, key: Key, delay: float) -> None:
        """Reconcile ``key`` in ``delay`` seconds (one timer per key: an earlier one stands)."""
        if key in self._timers:
            return

        def due() -> None:
            del self._timers[key]
            if self.stores[KIND].get(*key) is not None:
                self.enqueue(key, ROUTINE)

        self._timers[key] = asyncio.get_running_loop().call_later(delay, due)

    async def _work(self) -> None:
        await self.synced.wait()
        await self.writing.wait()
        while True:
            key = await self.queue.get()
            telemetry.QUEUE.set(len(self.queue))
            try:
                await self._reconcile(key)
            finally:
                self.queue.done(key)

    def _retry(self, key: Key, delay: float | None) -> None:
        n = self._failures[key] = self._failures.get(key, 0) + 1
        delay = delay if delay is not None else min(RETRY_BACKOFF_MAX, RETRY_BACKOFF_MIN * 2 ** (n - 1))
        asyncio.get_running_loop().call_later(delay, self.enqueue, key)

    async def _reconcile(self, key: Key) -> None:
        body = self.stores[KIND].get(*key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return  # gone or going: garbage collection removes the children
        started = time.monotonic()
        try:
            outcome = await reconcile(self.context, body, self.replicas(key), self.scaling(key))
        except TransientError as e:
            telemetry.RECONCILES.labels("retry").inc()
            log.info("reconcile %s/%s: retry in %ss: %s", *key, e.delay, e)
            self._retry(key, e.delay)
            return
        except KubeError as e:
            if e.status == 403 and "being terminated" in e.message:
                return  # its namespace is going away, and the object with it
            telemetry.RECONCILES.labels("error").inc()
            telemetry.ERRORS.labels(f"http_{e.status}").inc()
            log.error("reconcile %s/%s failed: %s", *key, e)
            self._retry(key, None)
            return
        except Exception as e:
            telemetry.RECONCILES.labels("error").inc()
            telemetry.ERRORS.labels(type(e).__name__).inc()
            log.exception("reconcile %s/%s failed", *key)
            self._retry(key, None)
            return
        finally:
            telemetry.DURATION.observe(time.monotonic() - started)
        self._failures.pop(key, None)
        if outcome.requeue_after is not None:
            self.enqueue_after(key, outcome.requeue_after)
        if outcome.status_written is not None:
            self.event(KIND, "MODIFIED", outcome.status_written, key)
        for change in outcome.changes:
            telemetry.WRITES.labels(change.action).inc()
        writes = len(outcome.changes) + (outcome.status_written is not None)
        telemetry.RECONCILES.labels("changed" if writes else "unchanged").inc()
        log.info(
            "reconciled namespace=%s name=%s writes=%d changes=%s",
            *key,
            writes,
            ",".join(str(c).replace(" ", ":") for c in outcome.changes) or "-",
        )
