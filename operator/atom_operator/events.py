"""Events on an AtomDeployment for each child the reconciler created, changed or deleted."""

from __future__ import annotations

import logging
import socket
from typing import Any

from atom_operator.apply import Change
from atom_operator.children.meta import MANAGER
from atom_operator.kube import Kube, KubeError

log = logging.getLogger(__name__)
REASONS = {"created": "ChildCreated", "changed": "ChildUpdated", "deleted": "ChildDeleted"}
_INSTANCE = socket.gethostname()


def build_event(owner: dict[str, Any], change: Change, now: str) -> dict[str, Any]:
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
        "type": "Normal",
        "reason": REASONS[change.action],
        "message": f"{change.action} {change.kind} {change.name}",
        "source": {"component": MANAGER},
        "reportingComponent": MANAGER,
        "reportingInstance": _INSTANCE,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def post(kube: Kube, owner: dict[str, Any], change: Change, now: str) -> None:
    # An Event is a courtesy: failing to post one must not fail (and so repeat) the reconcile.
    try:
        await kube.create(build_event(owner, change, now))
    except Exception as e:  # noqa: BLE001 - KubeError, TemporaryError, anything the connection raises
        level = logging.DEBUG if isinstance(e, KubeError) and e.status == 403 else logging.WARNING
        log.log(level, "event not posted: %s: %s", change, e)
