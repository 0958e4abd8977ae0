"""Make one child as desired with as few writes as possible: none at all when it already is.

A child needs a write when it is missing, when what we applied last (its applied-hash annotation) differs from
what we want now, or when someone changed a field we own by hand. Which fields are ours is stated in
:mod:`atom_operator.ownership`: fields others add (defaults, other managers) are left alone, except in the few
fields we own whole. The write is a forced server-side apply, so fields we applied before and dropped since go
away; where a field we own whole still holds someone else's entries after it, a JSON patch replaces that field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from atom_operator import ownership
from atom_operator.children.meta import APPLIED_HASH, MANAGER
from atom_operator.kube import Kube
from atom_operator.store import Key, Store

Action = Literal["created", "changed", "deleted"]
REPLACED_KINDS = {"Job"}  # kinds whose spec cannot be updated, only replaced


@dataclass(frozen=True)
class Change:
    action: Action
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.action} {self.kind} {self.name}"


async def ensure(
    kube: Kube, desired: dict[str, Any], current: dict[str, Any] | None, store: Store[dict[str, Any]], owner: Key
) -> Change | None:
    """Create or update ``desired`` (``current``: as it is, None if missing), keeping the answer in its kind's
    ``store``; None when nothing was written."""
    kind, meta = desired["kind"], desired["metadata"]
    if current is not None and not needs_write(desired, current):
        return None
    if kind in REPLACED_KINDS and current is not None:
        # A Job's pod template is immutable: a new artifact (or placement) is a new Job. Only what we applied
        # decides (a difference the server made would otherwise replace it over and over, recompiling each time).
        if (current["metadata"].get("annotations") or {}).get(APPLIED_HASH) == meta["annotations"][APPLIED_HASH]:
            return None
        await kube.delete(kind, meta["namespace"], meta["name"], uid=current["metadata"].get("uid"))
        store.delete(meta["namespace"], meta["name"])
    written = await kube.apply(desired, MANAGER)
    foreign = ownership.repairs(desired, written, contains)
    if foreign:
        written = await kube.patch_json(kind, meta["namespace"], meta["name"], foreign, MANAGER)
    store.put(written, owner)
    return Change("created" if current is None else "changed", kind, meta["name"])


async def remove(
    kube: Kube, store: Store[dict[str, Any]], namespace: str, name: str, current: dict[str, Any] | None, owner_uid: str
) -> Change | None:
    """Delete a child that should no longer exist, if it is ours (a same-named object of someone else stays)."""
    if current is None or not owned_by(current, owner_uid):
        return None
    deleted = await kube.delete(store.kind, namespace, name, uid=current["metadata"]["uid"])
    store.delete(namespace, name)
    return Change("deleted", store.kind, name) if deleted else None


async def current(
    kube: Kube, store: Store[dict[str, Any]], namespace: str, name: str, *, ask: bool
) -> dict[str, Any] | None:
    """The child as it is now. A watched kind's store is complete: a child it lacks does not exist. A kind no
    informer watches (``ask``) holds only our own writes' answers: a child it lacks costs a GET."""
    cached = store.get(namespace, name)
    return cached if cached is not None or not ask else await kube.get(store.kind, namespace, name)


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def needs_write(desired: dict[str, Any], current: dict[str, Any]) -> bool:
    applied = (current["metadata"].get("annotations") or {}).get(APPLIED_HASH)
    if applied != desired["metadata"]["annotations"][APPLIED_HASH]:
        return True
    return not contains(current, desired) or bool(ownership.repairs(desired, current, contains))


def contains(current: Any, desired: Any) -> bool:
    """Whether ``current`` holds every value of ``desired``. Maps may hold more keys; lists of named items may hold
    more items (matched by name: others' additions); other lists must match item by item."""
    if isinstance(desired, dict):
        return (
            isinstance(current, dict)
            and all(k in current and contains(current[k], v) for k, v in desired.items() if not _empty(v))
            and all(_empty(current.get(k)) for k, v in desired.items() if _empty(v))
        )
    if isinstance(desired, list) and desired and all(isinstance(d, dict) and "name" in d for d in desired):
        if not isinstance(current, list):
            return False
        by_name = {c.get("name"): c for c in current if isinstance(c, dict)}
        return all(d["name"] in by_name and contains(by_name[d["name"]], d) for d in desired)
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(contains(c, d) for c, d in zip(current, desired, strict=True))
        )
    return current == desired or same_quantity(current, desired)


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def same_quantity(a: Any, b: Any) -> bool:
    """The API server rewrites quantities canonically (1000m -> 1, 2048Mi -> 2Gi); compare their values."""
    x, y = _quantity(a), _quantity(b)
    return x is not None and x == y


# A quantity's suffix -> its factor, as the API server reads them (apimachinery's resource.Quantity).
_SUFFIXES = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3), ("M", 6), ("G", 9),
                                          ("T", 12), ("P", 15), ("E", 18))},
}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([KMGTPE]i|[numkMGTPE])?|[eE]([+-]?[0-9]+))")


def _quantity(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    found = _QUANTITY.fullmatch(str(value))
    if found is None:
        return None
    number, suffix, exponent = found.groups()
    try:
        factor = Decimal(10) ** int(exponent) if exponent is not None else _SUFFIXES[suffix or ""]
        return Decimal(number) * factor
    except (InvalidOperation, ArithmeticError, ValueError):
        return None
