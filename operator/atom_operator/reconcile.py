"""One reconcile of one AtomDeployment: children as desired, then status as observed. Level-based, idempotent."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from atom_operator import apply, artifacts, events, routing, status
from atom_operator.api import AtomDeployment
from atom_operator.autoscale.loop import with_replicas
from atom_operator.cache import ChildCache
from atom_operator.children import Children, Defaults, Owner, build_children
from atom_operator.children.inferencepool import epp_name
from atom_operator.children.meta import APPLIED_HASH, ROLES, Role, workload_name
from atom_operator.kube import ApiError, Kube
from atom_operator.npu import fusion_refusals

log = logging.getLogger(__name__)


@dataclass
class Observed:
    """What the watches have seen of one AtomDeployment's pods and Deployments (never polled)."""

    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)  # Deployment name -> slim copy
    pods: dict[str, status.PodView] = field(default_factory=dict)  # pod name -> view
    jobs: dict[str, artifacts.JobView] = field(default_factory=dict)  # compile Job name -> view


@dataclass(frozen=True)
class Outcome:
    changes: list[apply.Change]
    status_written: dict[str, Any] | None  # the AtomDeployment as the status patch returned it
    recheck: bool = False  # look again in routing.TTL seconds: the condition waits for a CRD no watch reports


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
    kube: Kube,
    body: dict[str, Any],
    observed: Observed,
    defaults: Defaults,
    cache: ChildCache | None = None,
    *,
    children_too: bool = True,
    cache_is_complete: bool = False,
    replicas: Mapping[Role, int] | None = None,
) -> Outcome:
    """Make the children match ``body`` (unless only status is asked for) and write status if it changed.

    ``cache``: the children as the watches saw them (without one, every child is read from the API server);
    ``cache_is_complete``: a child missing from it does not exist; ``replicas``: each role's count as the
    autoscaler set it (spec.autoscaling), instead of the spec's."""
    if cache is None:
        cache, cache_is_complete = ChildCache(), False
    owner = owner_of(body)
    if owner is None:
        return Outcome([], None)
    owner = with_replicas(owner, replicas)
    refusals = fusion_refusals(owner.spec, defaults.npu)
    if refusals:
        # The webhook refuses such specs; one admitted under another NPU profile is left as it is, said in the log.
        log.warning("skip AtomDeployment %s/%s: %s", owner.namespace, owner.name, "; ".join(refusals))
        return Outcome([], None)
    built = {j.key for j in observed.jobs.values() if j.state == "Succeeded"}
    enabled = owner.spec.routing.inference_pool.enabled
    served = await routing.DISCOVERY.kinds(kube) if enabled and children_too else frozenset()
    # Routing children may be left from an earlier reconcile (then those no longer wanted are removed): the status
    # reported on them, or the picker is there. Without either, nothing is asked of kinds no watch covers.
    routed_before = routing.reported(body) is not None or any(
        cache.get(kind, owner.namespace, epp_name(owner)) is not None for kind in ("Deployment", "Service"))
    wanted = build_children(owner, defaults, built, served, routed_before)
    # A status-only reconcile keeps the routing verdict of the last one that applied the children.
    verdict = routing.condition(owner, served) if children_too else routing.previous(owner, body)
    recheck = routing.waits_for_crd(verdict)
    changes = await converge(kube, body, owner, wanted, cache, cache_is_complete) if children_too else []
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
    generation, pods = body["metadata"].get("generation", 0), list(observed.pods.values())
    built_report = None
    if owner.spec.model.compile_cache:
        failed = [(p.role, p.failure) for p in pods if p.failure]
        built_report = artifacts.report(owner, wanted, observed.jobs, failed)
    new = status.compute(owner, generation, deployments, hashes, pods, old, now(), defaults.npu, built_report,
                         verdict)
    if _same(new, old):
        return Outcome(changes, None, recheck)
    try:
        written = await kube.patch_status("AtomDeployment", owner.namespace, owner.name, {"status": new})
    except ApiError as e:
        if e.status == 404:  # deleted meanwhile: nothing left to report on
            return Outcome(changes, None)
        raise
    return Outcome(changes, written, recheck)


async def converge(
    kube: Kube, body: dict[str, Any], owner: Owner, wanted: Children, cache: ChildCache, cache_is_complete: bool
) -> list[apply.Change]:
    """Services on their own, and beside them the ConfigMaps, then the Deployments (their pods read the settings at
    start) and the removals; each round concurrent. A Service does not hold up the pods: creating one allocates
    its cluster IP, the slowest write of all (p50 1.8 s in the 500-object benchmark). What each child is now
    comes from the watch cache; those it has not seen are read with GETs sent together up front, unless
    ``cache_is_complete``. A child's Event is posted as soon as it is written and holds up nothing but the end
    of the reconcile."""
    ns = owner.namespace
    services = [c for c in wanted.desired if c["kind"] == "Service"]
    configs = [c for c in wanted.desired if c["kind"] == "ConfigMap"]
    workloads = [c for c in wanted.desired if c["kind"] not in ("Service", "ConfigMap")]
    refs = [(c["kind"], c["metadata"]["name"]) for c in wanted.desired] + wanted.absent
    # The optional routing kinds are not watched (their CRDs may come and go): those are always read.
    found = await asyncio.gather(
        *(apply.current(kube, cache, k, ns, n, ask=not cache_is_complete or k in UNWATCHED) for k, n in refs)
    )
    now_ = dict(zip(refs, found, strict=True))
    changes: list[apply.Change] = []
    posting: list[asyncio.Task[None]] = []

    async def write_all(writes: list[Awaitable[apply.Change | None]]) -> None:
        # Every write of the round finishes, and those that went out are recorded with their Events, before the
        # first failure (if any) is raised and the reconcile retried.
        results = await asyncio.gather(*writes, return_exceptions=True)
        for r in results:
            if isinstance(r, apply.Change):
                changes.append(r)
                posting.append(asyncio.create_task(events.post(kube, body, r, now())))
        for r in results:
            if isinstance(r, BaseException):
                raise r

    def ensure(child: dict[str, Any]) -> Awaitable[apply.Change | None]:
        return apply.ensure(kube, child, now_[child["kind"], child["metadata"]["name"]], cache)

    async def configs_then_workloads() -> None:
        await write_all([ensure(c) for c in configs])
        await write_all(
            [ensure(c) for c in workloads]
            + [apply.remove(kube, cache, kind, ns, name, now_[kind, name], owner.uid) for kind, name in wanted.absent]
        )

    try:
        failed = await asyncio.gather(
            write_all([ensure(c) for c in services]), configs_then_workloads(), return_exceptions=True
        )
        for r in failed:
            if isinstance(r, BaseException):
                raise r
    finally:
        await asyncio.gather(*posting)  # events.post never raises
    return changes


UNWATCHED = {"InferencePool", "HTTPRoute", "ServiceAccount", "Role", "RoleBinding"}


def _same(new: dict[str, Any], old: dict[str, Any]) -> bool:
    return all(old.get(k) == v for k, v in new.items())
