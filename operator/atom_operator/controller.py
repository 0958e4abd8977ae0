"""The work queue: watch events mark AtomDeployments dirty, a few workers reconcile them one key at a time.

Like controller-runtime: events only enqueue a key (many events coalesce into one reconcile), a key is never
reconciled by two workers at once, failures retry with backoff. Caches of the children and pods are kept from
kopf's watches, so status never polls and a reconcile reads children from memory; the echo of our own write
enqueues nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf

from atom_operator import metrics
from atom_operator.cache import ChildCache
from atom_operator.children import Defaults
from atom_operator.children.meta import APPLIED_HASH, DEPLOYMENT_LABEL
from atom_operator.kube import ApiError, Kube
from atom_operator.reconcile import Observed, reconcile
from atom_operator.status import PodView

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, AtomDeployment name)
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0


def _rv(body: dict[str, Any]) -> int:
    try:
        return int(body["metadata"].get("resourceVersion", 0))
    except ValueError:  # opaque by contract; etcd's are integers
        return 0


class Controller:
    def __init__(self, kube: Kube, defaults: Defaults, workers: int = 16) -> None:
        self.kube, self.defaults = kube, defaults
        self.children = ChildCache()
        self.owners: dict[Key, dict[str, Any]] = {}
        self.observed: dict[Key, Observed] = {}
        self._pending: dict[Key, bool] = {}  # key -> whether children must be converged (not only status)
        self._running: set[Key] = set()
        self._failures: dict[Key, int] = {}
        # Owners created while we watch: a child of theirs missing from the cache was never made (we would have
        # its write's answer), so nobody asks the API server about it. After a start-up listing the cache may be
        # behind the watches, so there a missing child is looked up.
        self._born_watched: set[Key] = set()
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._workers = [asyncio.create_task(self._work(), name=f"reconcile-{i}") for i in range(workers)]

    def alive(self) -> bool:
        return all(not t.done() for t in self._workers)

    async def stop(self) -> None:
        for t in self._workers:
            t.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await self.kube.close()

    # ---- watch events ------------------------------------------------------------------------------------
    def observe_owner(self, event: str | None, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event == "DELETED":
            self.owners.pop(key, None)
            self.observed.pop(key, None)
            self._failures.pop(key, None)
            self._born_watched.discard(key)
            metrics.OBJECTS.set(len(self.owners))
            return
        old = self.owners.get(key)
        if old is not None and _rv(old) > _rv(body):
            return  # our own status patch already stored something newer
        self.owners[key] = body
        if event == "ADDED":
            self._born_watched.add(key)
        metrics.OBJECTS.set(len(self.owners))
        meta, old_meta = body["metadata"], (old or {}).get("metadata", {})
        # A listing (event None: start-up or a re-list) is a resync; otherwise only spec changes need children.
        if event is None or meta.get("generation") != old_meta.get("generation") or meta["uid"] != old_meta.get("uid"):
            self.enqueue(key)

    def observe_deployment(self, event: str | None, body: dict[str, Any]) -> None:
        key = self._owner_key(body)
        if key is None:
            return
        name = body["metadata"]["name"]
        known = self.children.get("Deployment", key[0], name)
        if known is not None and _rv(known) > _rv(body):
            return  # a late event: the answer to our own write already showed something newer
        news = self.children.seen("Deployment", event, body)
        deployments = self.observed.setdefault(key, Observed()).deployments
        old = deployments.pop(name, None)
        if event == "DELETED":
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

    def observe_child(self, event: str | None, body: dict[str, Any]) -> None:
        """ConfigMaps and Services: any change but our own write's echo might be a hand edit or deletion to undo."""
        key = self._owner_key(body)
        if key is not None and self.children.seen(body["kind"], event, body):
            self.enqueue(key)

    def observe_pod(self, event: str | None, body: dict[str, Any]) -> None:
        key = self._owner_key(body)
        if key is None:
            return
        pods = self.observed.setdefault(key, Observed()).pods
        name = body["metadata"]["name"]
        old = pods.get(name)
        if event == "DELETED" or body["metadata"].get("deletionTimestamp"):
            pods.pop(name, None)
            self._forget_if_gone(key)
            view = None
        else:
            view = pods[name] = PodView.of(body)
        if view != old:
            self.enqueue(key, children=False)

    def _forget_if_gone(self, key: Key) -> None:
        # Garbage collection deletes the children after their owner; drop what is left of it then.
        seen = self.observed.get(key)
        if key not in self.owners and seen is not None and not seen.pods and not seen.deployments:
            del self.observed[key]

    def _owner_key(self, body: dict[str, Any]) -> Key | None:
        owner = (body["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL)
        return (body["metadata"]["namespace"], owner) if owner else None

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

    async def _work(self) -> None:
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
                cache_is_complete=key in self._born_watched,
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
