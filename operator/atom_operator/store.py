"""One store per kind: every object as the watches and the answers to our own writes last showed it, by owner.

The controller's only memory of the cluster, like controller-runtime's cache: an informer fills a kind's store
(:mod:`atom_operator.informer`), a write's answer replaces the entry it changed, and a reconcile reads the
AtomDeployment's children, pods and Jobs from here (:meth:`Store.owned_by`), never from the API server. Every entry
remembers its resourceVersion, so an event that arrives late never replaces something newer, and a listing that
lacks an entry older than itself removes it (a deletion no watch reported). Reconciles start only after every
informer has listed once, so an object missing from a watched kind's store does not exist.

The kinds no informer watches (the routing kinds, whose CRDs may come and go) have stores too, filled only by the
answers to our writes; those are emptied at every resync, so a hand deletion there is found within one.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Key = tuple[str, str]  # (namespace, name) of an object, or of the AtomDeployment that owns it
T = TypeVar("T")
_ORDERED = re.compile(r"[1-9][0-9]*\Z")
_INTERNED_LENGTH = 64  # names, labels, images, quantities; not a ConfigMap's settings file


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


def trimmed(body: dict[str, Any]) -> dict[str, Any]:
    """An object as a store keeps it: without its managedFields, which no decision reads and which are often half
    its size, and its keys and short strings shared with every other object's (:func:`compact`)."""
    return compact({**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "managedFields"}})


def compact(value: Any) -> Any:
    """``value`` with its keys and short strings interned. Hundreds of children repeat the same keys, labels and
    images; each parsed event holds its own copies, which a store would keep for as long as the object lives."""
    if isinstance(value, dict):
        return {sys.intern(k): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= _INTERNED_LENGTH:
        return sys.intern(value)
    return value


@dataclass
class Entry(Generic[T]):
    owner: Key
    version: str
    value: T


class Store(Generic[T]):
    """The objects of one kind: (namespace, name) -> what is kept of each (``view`` of its body), and by owner."""

    def __init__(self, kind: str, view: Callable[[dict[str, Any]], T]) -> None:
        self.kind, self.view = kind, view
        self._entries: dict[Key, Entry[T]] = {}
        self._by_owner: dict[Key, dict[str, Entry[T]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, namespace: str, name: str) -> T | None:
        entry = self._entries.get((namespace, name))
        return entry.value if entry is not None else None

    def owned_by(self, owner: Key) -> dict[str, T]:
        """Name -> object, of every object ``owner`` has in this kind."""
        return {name: e.value for name, e in self._by_owner.get(owner, {}).items()}

    def entries(self) -> Iterator[tuple[Key, Entry[T]]]:
        return iter(list(self._entries.items()))

    def by_key(self) -> Mapping[Key, T]:
        """A live read-only view: (namespace, name) -> what is kept of each object."""
        return _ByKey(self)

    def put(self, body: dict[str, Any], owner: Key) -> bool:
        """Keep ``body`` (a watch event or the answer to our write); False when it tells nothing new: not newer
        than what is kept (our own write's echo, a late event) or the same view of it."""
        meta = body["metadata"]
        ref, version = (meta.get("namespace", ""), meta["name"]), resource_version(body)
        old = self._entries.get(ref)
        if old is not None and compare_versions(old.version, version) in (0, 1):
            return False
        value = self.view(body)
        if old is not None and old.owner != owner:
            self.delete(*ref)
            old = None
        entry = Entry(owner, version, value)
        self._entries[ref] = entry
        self._by_owner.setdefault(owner, {})[ref[1]] = entry
        return old is None or old.value != value

    def delete(self, namespace: str, name: str) -> Key | None:
        """Forget an object; its owner's key, None when it was not kept."""
        entry = self._entries.pop((namespace, name), None)
        if entry is None:
            return None
        mine = self._by_owner.get(entry.owner, {})
        mine.pop(name, None)
        if not mine:
            self._by_owner.pop(entry.owner, None)
        return entry.owner

    def tombstones(self, namespace: str | None, listed: set[Key], listed_at: str) -> list[Entry[T]]:
        """Forget, and return, what a complete listing of ``namespace`` (None: all) as of version ``listed_at``
        lacks: deleted while no watch saw it. An entry newer than the listing is the answer to our own write, made
        after the listing was taken, and stays; a version that cannot be ordered counts as older (a wrong guess
        costs one apply that changes nothing)."""
        gone = []
        for ref, entry in self.entries():
            in_scope = namespace is None or ref[0] == namespace
            if in_scope and ref not in listed and compare_versions(entry.version, listed_at) != 1:
                self.delete(*ref)
                gone.append(entry)
        return gone

    def clear(self, namespace: str | None = None) -> None:
        """Forget every object (of ``namespace`` only, when given)."""
        for ns, name in list(self._entries):
            if namespace is None or ns == namespace:
                self.delete(ns, name)


class _ByKey(Mapping[Key, T]):
    def __init__(self, store: Store[T]) -> None:
        self._store = store

    def __getitem__(self, key: Key) -> T:
        value = self._store.get(*key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[Key]:
        return (ref for ref, _ in self._store.entries())

    def __len__(self) -> int:
        return len(self._store)


class Stores:
    """Every kind's store, by kind; as an informer's sink (:class:`atom_operator.informer.Sink`), it keeps what the
    watches show and nothing more (the controller, :mod:`atom_operator.controller`, also queues reconciles)."""

    def __init__(self, views: dict[str, Callable[[dict[str, Any]], Any]]) -> None:
        self._stores = {kind: Store(kind, view) for kind, view in views.items()}

    def __getitem__(self, kind: str) -> Store[Any]:
        return self._stores[kind]

    def __contains__(self, kind: str) -> bool:
        return kind in self._stores

    def event(self, kind: str, type_: str | None, body: dict[str, Any], key: Key) -> None:
        meta = body["metadata"]
        if type_ == "DELETED":
            self[kind].delete(meta.get("namespace", ""), meta["name"])
        else:
            self[kind].put(body, key)

    def relisted(self, listing: Any) -> None:  # an informer.Listing (which imports nothing of this module)
        listed = {(b["metadata"].get("namespace", ""), b["metadata"]["name"]) for b, _ in listing.items}
        self[listing.kind].tombstones(listing.namespace, listed, listing.resource_version)
        for body, key in listing.items:
            self.event(listing.kind, None, body, key)
