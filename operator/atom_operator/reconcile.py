"""One reconcile of one AtomDeployment: children as desired, then status as observed. Level-based, idempotent."""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from typing import Any

from atom_engine.api import AtomDeployment
from pydantic import ValidationError

from atom_operator import apply, events, status
from atom_operator.children import Children, Defaults, Owner, build_children
from atom_operator.children.meta import APPLIED_HASH, ROLES, Role, workload_name
from atom_operator.kube import ApiError, Kube

log = logging.getLogger(__name__)


@dataclass
class Observed:
    """What the watches have seen of one AtomDeployment's pods and Deployments (never polled)."""

    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)  # Deployment name -> slim copy
    pods: dict[str, status.PodView] = field(default_factory=dict)  # pod name -> view


@dataclass(frozen=True)
class Outcome:
    changes: list[apply.Change]
    status_written: dict[str, Any] | None  # the AtomDeployment as the status patch returned it


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def owner_of(body: dict[str, Any]) -> Owner | None:
    meta = body["metadata"]
    try:
        spec = AtomDeployment.model_validate(body).spec
    except ValidationError as e:
        # The CRD's CEL rules and the webhook refuse such objects; one stored before them is left alone.
        log.warning("skip invalid AtomDeployment %s/%s: %s", meta["namespace"], meta["name"], e)
        return None
    return Owner(meta["name"], meta["namespace"], meta["uid"], spec)


async def reconcile(
    kube: Kube, body: dict[str, Any], observed: Observed, defaults: Defaults, *, children_too: bool = True
) -> Outcome:
    """Make the children match ``body`` (unless only status is asked for) and write status if it changed."""
    owner = owner_of(body)
    if owner is None:
        return Outcome([], None)
    wanted = build_children(owner, defaults)
    changes = await converge(kube, body, owner, wanted) if children_too else []
    hashes: dict[Role, str] = {}
    deployments: dict[Role, dict[str, Any] | None] = {}
    for role in ROLES:
        name = workload_name(owner, role)
        deployments[role] = observed.deployments.get(name)
        hashes[role] = next(
            (
                c["metadata"]["annotations"][APPLIED_HASH]
                for c in wanted.desired
                if c["kind"] == "Deployment" and c["metadata"]["name"] == name
            ),
            "",
        )
    old = body.get("status") or {}
    new = status.compute(
        owner, body["metadata"].get("generation", 0), deployments, hashes, list(observed.pods.values()), old, now()
    )
    if _same(new, old):
        return Outcome(changes, None)
    try:
        written = await kube.patch_status("AtomDeployment", owner.namespace, owner.name, {"status": new})
    except ApiError as e:
        if e.status == 404:  # deleted meanwhile: nothing left to report on
            return Outcome(changes, None)
        raise
    return Outcome(changes, written)


async def converge(kube: Kube, body: dict[str, Any], owner: Owner, wanted: Children) -> list[apply.Change]:
    changes = []
    for child in wanted.desired:
        change = await apply.ensure(kube, child)
        if change:
            changes.append(change)
            await events.post(kube, body, change, now())
    for kind, name in wanted.absent:
        change = await apply.remove(kube, kind, owner.namespace, name, owner.uid)
        if change:
            changes.append(change)
            await events.post(kube, body, change, now())
    return changes


def _same(new: dict[str, Any], old: dict[str, Any]) -> bool:
    return all(old.get(k) == v for k, v in new.items())
