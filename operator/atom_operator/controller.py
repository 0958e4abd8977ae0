"""The work queue: informer events mark AtomDeployments dirty, a few workers reconcile them one key at a time.

Like controller-runtime: events only enqueue a key (many events coalesce into one reconcile), a key is never
reconciled by two workers at once, failures retry with backoff, and no worker starts before every informer has
listed once. Caches of the children and pods are kept from the informers (:mod:`atom_operator.informer`), so
status never polls and a reconcile reads children from memory; the echo of our own write enqueues nothing; a
listing that lacks something we knew of is a deletion no watch reported, and is repaired like one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from atom_operator import metrics, routing
from atom_operator.api import GROUP, KIND
from atom_operator.artifacts import JobView
from atom_operator.cache import ChildCache, compare_versions, newer, resource_version
from atom_operator.children import Defaults
from atom_operator.children.meta import APPLIED_HASH
from atom_operator.informer import Listing, controlled_by
from atom_operator.kube import ApiError, Kube
from atom_operator.reconcile import Observed, reconcile
from atom_operator.status import PodView

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, AtomDeployment name)
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0


class Controller:
    """The informers' sink (:class:`atom_operator.informer.Sink`) and the work queue behind it."""

    def __init__(self, kube: Kube, defaults: Defaults, workers: int = 16) -> None:
        self.kube, self.defaults = kube, defaults
        self.children = ChildCache()
        self.owners: dict[Key, dict[str, Any]] = {}
        self.observed: dict[Key, Observed] = {}
        self._pending: dict[Key, bool] = {}  # key -> whether children must be converged (not only status)
        self._running: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._rechecks: set[Key] = set()  # keys with a routing.TTL re-check timer running
        self.replicas: Callable[[Key], Mapping[str, int] | None] = lambda _key: None  # spec.autoscaling's counts
        # Set once every informer has listed: until then a reconcile would see a partial world (no Deployment
        # status yet: "0 of 1 ready", a false Ready=False written on every restart; a child not listed yet:
        # created again). Events queue up meanwhile and are reconciled after.
        self.synced = asyncio.Event()
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._workers = [asyncio.create_task(self._work(), name=f"reconcile-{i}") for i in range(workers)]

    def alive(self) -> bool:
        return all(not t.done() for t in self._workers)

    async def stop(self) -> None:
        for t in self._workers:
            t.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await self.kube.close()

    # ---- the informers' sink -----------------------------------------------------------------------------
    def event(self, kind: str, type_: str | None, body: dict[str, Any], key: Key) -> None:
        if kind == "AtomDeployment":
            self.observe_owner(type_, body)
        elif kind == "Deployment":
            self.observe_deployment(type_, body, key)
        elif kind == "Pod":
            self.observe_pod(type_, body, key)
        elif kind == "Job":
            self.observe_job(type_, body, key)
        else:
            self.observe_child(type_, body, key)

    def relisted(self, listing: Listing) -> None:
        """A complete listing: what we knew of and it lacks was deleted while no watch saw it (a tombstone);
        then every listed object, as a resync."""
        listed = {(b["metadata"]["namespace"], b["metadata"]["name"]) for b, _ in listing.items}

        def vanished(namespace: str, name: str, version: str = "") -> bool:
            # Newer than the listing: our own write's answer, made after the listing was taken; not a tombstone.
            # A version that cannot be ordered counts as older: a wrong guess costs one apply that changes nothing.
            in_scope = listing.namespace is None or namespace == listing.namespace
            later = compare_versions(version, listing.resource_version) == 1
            return in_scope and (namespace, name) not in listed and not later

        tombstones = 0
        if listing.kind == "AtomDeployment":
            for key, body in list(self.owners.items()):
                if vanished(*key, resource_version(body)):
                    tombstones += 1
                    self.observe_owner("DELETED", body)
        elif listing.kind == "Pod":
            for key, seen in list(self.observed.items()):
                for name in [n for n in seen.pods if vanished(key[0], n)]:
                    tombstones += 1
                    self._drop_pod(key, name)
        else:
            for body in self.children.of_kind(listing.kind):
                meta = body["metadata"]
                if vanished(meta["namespace"], meta["name"], resource_version(body)):
                    tombstones += 1
                    self._vanished_child(listing.kind, body)
            if listing.kind == "Deployment":  # the slim copies status reads, should the cache have lost one
                for key, seen in list(self.observed.items()):
                    for name in [n for n in seen.deployments if vanished(key[0], n)]:
                        seen.deployments.pop(name, None)
                        self._forget_if_gone(key)
                        self.enqueue(key)
        if tombstones:
            log.info("event=tombstones kind=%s count=%d", listing.kind, tombstones)
        for body, key in listing.items:
            self.event(listing.kind, None, body, key)

    def _vanished_child(self, kind: str, body: dict[str, Any]) -> None:
        key = controlled_by(KIND, GROUP)(body)
        self.children.forget(kind, body["metadata"]["namespace"], body["metadata"]["name"])
        if kind == "Deployment" and key is not None:
            self.observed.get(key, Observed()).deployments.pop(body["metadata"]["name"], None)
            self._forget_if_gone(key)
        if kind == "Job" and key is not None:
            self.observed.get(key, Observed()).jobs.pop(body["metadata"]["name"], None)
        if key is not None:
            self.enqueue(key)

    # ---- watch events ------------------------------------------------------------------------------------
    def observe_owner(self, event: str | None, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event == "DELETED":
            self.owners.pop(key, None)
            self.observed.pop(key, None)
            self._failures.pop(key, None)
            metrics.OBJECTS.set(len(self.owners))
            return
        old = self.owners.get(key)
        if old is not None and newer(old, body):
            return  # our own status patch already stored something newer
        self.owners[key] = body
        metrics.OBJECTS.set(len(self.owners))
        meta, old_meta = body["metadata"], (old or {}).get("metadata", {})
        # A listing (event None: start-up, a reconnect, a resync) is a resync; otherwise only spec changes need
        # children.
        if event is None or meta.get("generation") != old_meta.get("generation") or meta["uid"] != old_meta.get("uid"):
            self.enqueue(key)

    def observe_deployment(self, event: str | None, body: dict[str, Any], key: Key) -> None:
        name = body["metadata"]["name"]
        known = self.children.get("Deployment", key[0], name)
        if known is not None and newer(known, body) and event != "DELETED":
            return  # a late event: the answer to our own write already showed something newer
        news = self.children.seen("Deployment", event, body)
        deployments = self.observed.setdefault(key, Observed()).deployments
        old = deployments.pop(name, None)
        if event == "DELETED":
            self.children.forget("Deployment", key[0], name)
            self._forget_if_gone(key)
            self.enqueue(key)
            return
        meta = body["metadata"]
        slim = {
            "metadata": {
                "generation": meta.get("generation"),
                "labels": meta.get("labels"),
                "annotations": {APPLIED_HASH: (meta.get("annotations") or {}).get(APPLIED_HASH)},
            },
            "status": body.get("status") or {},
        }
        deployments[name] = slim
        # A new generation means the spec changed, by hand or by us; the echo of our own write (no news) and status
        # moves only need status.
        touched = news and (old is None or old["metadata"] != slim["metadata"])
        self.enqueue(key, children=touched or event is None)

    def observe_job(self, event: str | None, body: dict[str, Any], key: Key) -> None:
        """Compile Jobs: their outcome releases (or holds back) the role's Deployment and sets ArtifactReady."""
        self.observe_child(event, body, key)
        jobs = self.observed.setdefault(key, Observed()).jobs
        name = body["metadata"]["name"]
        old = jobs.pop(name, None)
        if event == "DELETED":
            self.enqueue(key)
            return
        view = jobs[name] = JobView.of(body)
        if view != old:
            self.enqueue(key)

    def observe_child(self, event: str | None, body: dict[str, Any], key: Key) -> None:
        """ConfigMaps and Services: any change but our own write's echo might be a hand edit or deletion to undo."""
        if event == "DELETED":
            # Also when it only stopped being ours (its owner reference removed): gone from the cache either way.
            self.children.forget(body["kind"], body["metadata"]["namespace"], body["metadata"]["name"])
            self.enqueue(key)
        elif self.children.seen(body["kind"], event, body):
            self.enqueue(key)

    def observe_pod(self, event: str | None, body: dict[str, Any], key: Key) -> None:
        pods = self.observed.setdefault(key, Observed()).pods
        name = body["metadata"]["name"]
        if event == "DELETED" or body["metadata"].get("deletionTimestamp"):
            self._drop_pod(key, name)
            return
        view = PodView.of(body)
        if pods.get(name) != view:
            pods[name] = view
            self.enqueue(key, children=False)

    def _drop_pod(self, key: Key, name: str) -> None:
        if self.observed.get(key, Observed()).pods.pop(name, None) is not None:
            self.enqueue(key, children=False)
        self._forget_if_gone(key)

    def _forget_if_gone(self, key: Key) -> None:
        # Garbage collection deletes the children after their owner; drop what is left of it then.
        seen = self.observed.get(key)
        if key not in self.owners and seen is not None and not seen.pods and not seen.deployments:
            del self.observed[key]

    # ---- the queue ---------------------------------------------------------------------------------------
    def enqueue(self, key: Key, children: bool = True) -> None:
        if key in self._pending:
            self._pending[key] |= children
            return
        self._pending[key] = children
        if key not in self._running:
            self._queue.put_nowait(key)
        metrics.QUEUE.set(len(self._pending))

    def _retry(self, key: Key, delay: float | None) -> None:
        n = self._failures[key] = self._failures.get(key, 0) + 1
        delay = delay if delay is not None else min(BACKOFF_MAX, BACKOFF_MIN * 2 ** (n - 1))
        asyncio.get_running_loop().call_later(delay, self.enqueue, key)

    def _recheck(self, key: Key) -> None:
        """Reconcile ``key`` again in routing.TTL seconds (one timer per key): its routing condition waits for a
        CRD, whose arrival no watch reports."""
        if key in self._rechecks:
            return
        self._rechecks.add(key)

        def due() -> None:
            self._rechecks.discard(key)
            if key in self.owners:
                self.enqueue(key)

        asyncio.get_running_loop().call_later(routing.TTL, due)

    async def _work(self) -> None:
        await self.synced.wait()
        while True:
            key = await self._queue.get()
            children = self._pending.pop(key, True)
            metrics.QUEUE.set(len(self._pending))
            self._running.add(key)
            try:
                await self._reconcile(key, children)
            finally:
                self._running.discard(key)
                if key in self._pending:  # events arrived while it ran: go again
                    self._queue.put_nowait(key)

    async def _reconcile(self, key: Key, children: bool) -> None:
        body = self.owners.get(key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return  # gone or going: garbage collection removes the children
        started = time.monotonic()
        try:
            outcome = await reconcile(
                self.kube,
                body,
                self.observed.setdefault(key, Observed()),
                self.defaults,
                self.children,
                children_too=children,
                # The informers listed every child before any reconcile and keep the cache since: a child it
                # lacks does not exist (or its deletion is on its way as an event, which reconciles again).
                cache_is_complete=True,
                replicas=self.replicas(key),
            )
        except kopf.TemporaryError as e:
            metrics.RECONCILES.labels("retry").inc()
            log.info("reconcile %s/%s: retry in %ss: %s", *key, e.delay, e)
            self._retry(key, e.delay)
            return
        except ApiError as e:
            if e.status == 403 and "being terminated" in e.message:
                return  # its namespace is going away, and the object with it
            metrics.RECONCILES.labels("error").inc()
            metrics.ERRORS.labels(f"http_{e.status}").inc()
            log.error("reconcile %s/%s failed: %s", *key, e)
            self._retry(key, None)
            return
        except Exception as e:
            metrics.RECONCILES.labels("error").inc()
            metrics.ERRORS.labels(type(e).__name__).inc()
            log.exception("reconcile %s/%s failed", *key)
            self._retry(key, None)
            return
        finally:
            metrics.DURATION.observe(time.monotonic() - started)
        self._failures.pop(key, None)
        if outcome.recheck:
            self._recheck(key)
        if outcome.status_written is not None:
            self.observe_owner("MODIFIED", outcome.status_written)
        for change in outcome.changes:
            metrics.WRITES.labels(change.action).inc()
        writes = len(outcome.changes) + (outcome.status_written is not None)
        metrics.RECONCILES.labels("changed" if writes else "unchanged").inc()
        log.info(
            "reconciled namespace=%s name=%s children=%s writes=%d changes=%s",
            *key,
            children,
            writes,
            ",".join(str(c).replace(" ", ":") for c in outcome.changes) or "-",
        )
