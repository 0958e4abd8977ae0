"""Which fields of a child are the operator's, stated once; the applier (:mod:`atom_operator.apply`) enforces it.

The policy, field by field:

- Every field the operator sets is its own: a hand edit of its value is undone by the next forced server-side
  apply, which also brings back what was removed.
- Our labels (``children.meta.labels``) are restored when changed or removed; labels and annotations that others
  add stay.
- Three fields are ours *whole*, because an addition there changes what the child does:
    - a Service's ``spec.selector``: one added key and the Service selects no pod, all traffic goes nowhere
      (the API server stores the selector as an atomic map, so the apply alone replaces it whole);
    - a ConfigMap's ``data``: the whole map is mounted as the engine's configuration directory;
    - the ``engine`` container's ``env``: the engine's environment is its configuration too.
  Anything else found there is removed (a JSON patch replaces the field, since server-side apply leaves the
  entries of another field manager alone in a granular map or list).
- Everything else others add is left alone: an extra container or volume a mutating webhook injects, another
  controller's annotations, a port or toleration someone appends. Lists of named items (containers, ports,
  volumes, env outside our container) are compared by name, so an added item is not a difference to undo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENGINE_CONTAINER = "engine"


@dataclass(frozen=True)
class Named:
    """A path step into a list of named items: the item with this ``name``."""

    name: str


Step = str | Named

# kind -> the paths whose value is ours whole (see the module docstring for why each is on the list).
EXACT: dict[str, tuple[tuple[Step, ...], ...]] = {
    "Service": (("spec", "selector"),),
    "ConfigMap": (("data",),),
    "Deployment": (("spec", "template", "spec", "containers", Named(ENGINE_CONTAINER), "env"),),
}

_MISSING = object()


def _walk(obj: Any, path: tuple[Step, ...]) -> tuple[list[str | int], Any]:
    """The JSON-pointer segments and the value at ``path`` in ``obj`` (``_MISSING`` where it has no such field)."""
    at: list[str | int] = []
    for step in path:
        if isinstance(step, Named):
            index = next(
                (i for i, item in enumerate(obj if isinstance(obj, list) else []) if item.get("name") == step.name),
                None,
            )
            if index is None:
                return at, _MISSING
            at.append(index)
            obj = obj[index]
        else:
            if not isinstance(obj, dict) or step not in obj:
                return at + [step], _MISSING
            at.append(step)
            obj = obj[step]
    return at, obj


def pointer(segments: list[str | int]) -> str:
    return "".join("/" + str(s).replace("~", "~0").replace("/", "~1") for s in segments)


def repairs(desired: dict[str, Any], current: dict[str, Any], same: Any) -> list[dict[str, Any]]:
    """JSON-patch operations that make every field we own whole in ``current`` exactly ``desired``'s; [] when
    nothing is foreign. ``same(current, desired)`` compares values the way the applier does (server defaults and
    canonical quantities inside an item are not differences); on top, neither side may hold a key or named item
    the other lacks."""
    ops: list[dict[str, Any]] = []
    for path in EXACT.get(desired["kind"], ()):
        _, want = _walk(desired, path)
        at, have = _walk(current, path)
        if want is _MISSING or have is _MISSING or _exactly(have, want, same):
            continue
        # Guard the list indexes on the way with a test of the item's name: the patch fails (and the reconcile
        # retries) rather than replace a field of another item, should the list have changed in between.
        for i, step in enumerate(path):
            if isinstance(step, Named):
                ops.append({"op": "test", "path": pointer([*at[: i + 1], "name"]), "value": step.name})
        ops.append({"op": "replace", "path": pointer(at), "value": want})
    return ops


def _exactly(have: Any, want: Any, same: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and set(have) == set(want) and same(have, want)
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(have) == len(want)
            and [_key(i) for i in have] == [_key(i) for i in want]
            and all(same(h, w) for h, w in zip(have, want, strict=True))
        )
    return same(have, want)


def _key(item: Any) -> Any:
    return item.get("name") if isinstance(item, dict) else item
