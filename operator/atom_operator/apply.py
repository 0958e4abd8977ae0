"""Make one child as desired with as few writes as possible: none at all when it already is.

A child needs a write when it is missing, when what we applied last (its applied-hash annotation) differs from
what we want now, or when someone changed a field we own by hand. Fields others add (defaults, other managers)
are left alone. The write is a forced server-side apply, so fields we applied before and dropped since go away.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from atom_operator.children.meta import APPLIED_HASH, MANAGER
from atom_operator.kube import Kube

Action = Literal["created", "changed", "deleted"]


@dataclass(frozen=True)
class Change:
    action: Action
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.action} {self.kind} {self.name}"


async def ensure(kube: Kube, desired: dict[str, Any]) -> Change | None:
    """Create or update ``desired``; None when the cluster already matches (nothing was written)."""
    meta = desired["metadata"]
    current = await kube.get(desired["kind"], meta["namespace"], meta["name"])
    if current is not None and not needs_write(desired, current):
        return None
    await kube.apply(desired, MANAGER)
    return Change("created" if current is None else "changed", desired["kind"], meta["name"])


async def remove(kube: Kube, kind: str, namespace: str, name: str, owner_uid: str) -> Change | None:
    """Delete a child that should no longer exist, if it is ours (a same-named object of someone else stays)."""
    current = await kube.get(kind, namespace, name)
    if current is None or not owned_by(current, owner_uid):
        return None
    if not await kube.delete(kind, namespace, name, uid=current["metadata"]["uid"]):
        return None
    return Change("deleted", kind, name)


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def needs_write(desired: dict[str, Any], current: dict[str, Any]) -> bool:
    applied = (current["metadata"].get("annotations") or {}).get(APPLIED_HASH)
    if applied != desired["metadata"]["annotations"][APPLIED_HASH]:
        return True
    return not contains(current, desired)


def contains(current: Any, desired: Any) -> bool:
    """Whether ``current`` holds every value of ``desired``; maps may hold more, lists must match item by item."""
    if isinstance(desired, dict):
        return (
            isinstance(current, dict)
            and all(k in current and contains(current[k], v) for k, v in desired.items() if not _empty(v))
            and all(_empty(current.get(k)) for k, v in desired.items() if _empty(v))
        )
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(contains(c, d) for c, d in zip(current, desired, strict=True))
        )
    return current == desired or same_quantity(current, desired)


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([KMGTPE]i|[numkMGTPE])?$")
_FACTORS = {
    "": 1,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    **{s + "i": 1024 ** (i + 1) for i, s in enumerate("KMGTPE")},
}


def same_quantity(a: Any, b: Any) -> bool:
    """The API server rewrites quantities canonically (1000m -> 1, 2048Mi -> 2Gi); compare their values."""
    x, y = _quantity(a), _quantity(b)
    return x is not None and x == y


def _quantity(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    match = _QUANTITY.match(str(value))
    if not match:
        return None
    try:
        return Decimal(match.group(1)) * _FACTORS[match.group(2) or ""]
    except InvalidOperation:
        return None
