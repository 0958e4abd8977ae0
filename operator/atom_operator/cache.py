"""The children as the watches and our own writes last showed them, so a reconcile reads no child from the API.

Filled from the informers (ConfigMaps, Services, Deployments controlled by an AtomDeployment) and from the answers
to our own writes, which are newer than the watch event that echoes them. Every entry remembers its
resourceVersion, so an event that arrives late never replaces something newer. Reconciles start only after every
informer has listed once, and a later listing removes what it lacks (a deletion no watch reported), so a child
missing here does not exist.
"""

from __future__ import annotations

import re
from typing import Any

Ref = tuple[str, str, str]  # (kind, namespace, name)
_ORDERED = re.compile(r"[1-9][0-9]*\Z")


def resource_version(body: dict[str, Any]) -> str:
    return str(body["metadata"].get("resourceVersion", ""))


def compare_versions(a: str, b: str) -> int | None:
    """-1, 0 or 1 as resourceVersion ``a`` (of one resource) is older than, the same as or newer than ``b``; None
    when the two cannot be ordered.

    The API's contract makes them opaque, with one exception (KEP-5504, GA in Kubernetes 1.35; client-go's
    ``CompareResourceVersion``): the versions of one resource that are decimal integers without leading zeros are
    ordered by value. Those are compared as such, digit strings by length and then digit by digit; anything else
    only for equality."""
    if a == b:
        return 0
    if not (_ORDERED.match(a) and _ORDERED.match(b)):
        return None
    return 1 if (len(a), a) > (len(b), b) else -1


def newer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether object ``a`` is known to be a later version than ``b`` (of the same object)."""
    return compare_versions(resource_version(a), resource_version(b)) == 1


def ref_of(kind: str, body: dict[str, Any]) -> Ref:
    return kind, body["metadata"]["namespace"], body["metadata"]["name"]


class ChildCache:
    def __init__(self) -> None:
        self._objects: dict[Ref, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get((kind, namespace, name))

    def seen(self, kind: str, event: str | None, body: dict[str, Any]) -> bool:
        """Take a watch event; False when it tells nothing new (our own write's echo, or older than what we have)."""
        ref = ref_of(kind, body)
        old = self._objects.get(ref)
        if old is not None and compare_versions(resource_version(old), resource_version(body)) in (0, 1):
            return False
        if event == "DELETED":
            self._objects.pop(ref, None)
            return True
        self.store(kind, body)
        return True

    def store(self, kind: str, body: dict[str, Any]) -> None:
        """Keep ``body`` (an answer to our write or a watch event) without what no write decision reads: the
        managedFields and the status (the controller keeps the few status fields it reports on)."""
        meta = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
        self._objects[ref_of(kind, body)] = {**{k: v for k, v in body.items() if k != "status"}, "metadata": meta}

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [body for (k, _, _), body in self._objects.items() if k == kind]

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self._objects.pop((kind, namespace, name), None)
