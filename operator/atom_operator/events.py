"""Events on an AtomDeployment: for each child the reconciler created, changed or deleted, and for the autoscaler's
decisions and drains.

Events are posted the way client-go's event recorder posts them: in the background, a few at a time, never holding
up the reconcile or the decision that recorded them. An Event is a courtesy to the people reading ``kubectl
describe``; when the API server is so slow that the backlog fills, new ones are dropped (and counted in the log)
rather than queueing the operator's memory or its reconciles behind them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from atom_operator.children.meta import MANAGER
from atom_operator.kube import Kube, KubeError

log = logging.getLogger(__name__)
CHILD_REASONS = {"created": "ChildCreated", "changed": "ChildUpdated", "deleted": "ChildDeleted"}
POSTING = 8  # Events sent at once: beside the reconcile workers' requests, never instead of them
BACKLOG = 1000  # Events waiting to be sent before new ones are dropped (client-go's broadcaster queues as many)
_INSTANCE = socket.gethostname()


def build_event(owner: dict[str, Any], reason: str, message: str, now: str, warning: bool = False) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": "Warning" if warning else "Normal",
        "reason": reason,
        "message": message,
        "source": {"component": MANAGER},
        "reportingComponent": MANAGER,
        "reportingInstance": _INSTANCE,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class Recorder:
    """Posts Events in the background, at most :data:`POSTING` at once and :data:`BACKLOG` waiting."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._sending = asyncio.Semaphore(POSTING)
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped = 0

    def record(self, owner: dict[str, Any], reason: str, message: str, now: str, warning: bool = False) -> None:
        if len(self._tasks) >= BACKLOG:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("event=events_dropped count=%d reason=backlog_full", self.dropped)
            return
        task = asyncio.get_running_loop().create_task(self._post(build_event(owner, reason, message, now, warning)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the Events recorded so far (on shutdown; in tests)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    async def _post(self, event: dict[str, Any]) -> None:
        async with self._sending:
            await post(self.kube, event)


async def post(kube: Kube, event: dict[str, Any]) -> None:
    """Post one Event now. Failing to post an Event must not fail (and so repeat) what it tells of."""
    try:
        await kube.create(event)
    except Exception as e:  # noqa: BLE001 - KubeError, TransientError, anything the connection raises
        level = logging.DEBUG if isinstance(e, KubeError) and e.status == 403 else logging.WARNING
        log.log(level, "event not posted: %s %s: %s", event["reason"], event["message"], e)
