"""Test hook, imported into the operator's process before it starts (:mod:`tests.operator.process` adds it):
exit right after the n-th successful write into one namespace, or stop getting answers about the Lease.

``ATOM_FAILPOINT=exit-after-write:<n>:<namespace>`` lets the tests kill the operator at exact points of a create
(a SIGKILL from outside could not hit a point between two writes a millisecond apart).
``ATOM_FAILPOINT=hang-lease-after:<n>`` makes every Lease request after the n-th Lease write wait forever, while
every other request is answered: a leader whose renewals hang (a partition, an overloaded API server) but whose
writes would still go through. The operator's client knows nothing of either: its methods are wrapped here, when
this module is imported, before the operator starts.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from typing import Any

from atom_operator.kube import Kube

ENV = "ATOM_FAILPOINT"
WRITES = ("apply", "create", "patch_status", "patch_json", "delete")


def namespace_of(write: Any, *args: Any, **kwargs: Any) -> str | None:
    bound = inspect.signature(write).bind(*args, **kwargs).arguments
    return bound["obj"]["metadata"].get("namespace") if "obj" in bound else bound.get("namespace")


def install(after: int, namespace: str) -> None:
    seen = 0

    def counted(write: Any) -> Any:
        @functools.wraps(write)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            nonlocal seen
            out = await write(*args, **kwargs)
            # A delete of something already gone (False) wrote nothing.
            if out is not False and namespace_of(write, *args, **kwargs) == namespace:
                seen += 1
                if seen >= after:
                    os._exit(137)  # as abrupt as SIGKILL: no cleanup, nothing flushed
            return out

        return wrapper

    for name in WRITES:
        setattr(Kube, name, counted(getattr(Kube, name)))


def hang_lease(after: int) -> None:
    written = 0

    def of_lease(call: Any, *args: Any, **kwargs: Any) -> bool:
        bound = inspect.signature(call).bind(*args, **kwargs).arguments
        return (bound["obj"]["kind"] if "obj" in bound else bound.get("kind")) == "Lease"

    def hung(call: Any, write: bool) -> Any:
        @functools.wraps(call)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            nonlocal written
            if not of_lease(call, *args, **kwargs):
                return await call(*args, **kwargs)
            if written >= after:
                await asyncio.Event().wait()  # no answer, and no error either: only the caller's own bound ends it
            out = await call(*args, **kwargs)
            written += write
            return out

        return wrapper

    for name, write in (("get", False), ("create", True), ("replace", True)):
        setattr(Kube, name, hung(getattr(Kube, name), write))


spec = os.environ.get(ENV, "")
if spec.startswith("exit-after-write:"):
    _, n, ns = spec.split(":", 2)
    install(int(n), ns)
elif spec.startswith("hang-lease-after:"):
    hang_lease(int(spec.split(":", 1)[1]))
