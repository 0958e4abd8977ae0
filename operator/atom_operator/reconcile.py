"""One reconcile of one AtomDeployment: children as desired, then status as observed. Level-based, idempotent.

Everything it reads of the cluster comes from the stores (:mod:`atom_operator.store`); every reconcile builds the
children it wants and compares them with the stores, so it writes exactly what differs (nothing, most of the
time) whatever event queued it.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from atom_operator import apply, compile_jobs, events, routing, status
from atom_operator.api import AtomDeployment
from atom_operator.autoscale.loop import with_replicas
from atom_operator.children import Children, Defaults, Owner, build_children
from atom_operator.children.inferencepool import epp_name
from atom_operator.children.meta import APPLIED_HASH, ROLES, WorkloadRole, workload_name
from atom_operator.kube import Kube, KubeError
from atom_operator.npu import fusion_refusals
from atom_operator.store import Stores

log = logging.getLogger(__name__)
# The kinds no informer watches: the routing kinds, whose CRDs may come and go, and the picker's identity.
UNWATCHED = ("InferencePool", "HTTPRoute", "ServiceAccount", "Role", "RoleBinding")


@dataclass(frozen=True)
class Context:
    """What every reconcile of one controller shares."""

    kube: Kube
    defaults: Defaults
    stores: Stores
    discovery: routing.Discovery
    events: events.Recorder


@dataclass(frozen=True)
class Outcome:
    changes: list[apply.Change]
    status_written: dict[str, Any] | None  # the AtomDeployment as the status patch returned it
    # Reconcile again in this many seconds, with or without an event: the condition waits for a CRD (routing.TTL).
    requeue_after: float | None = None


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def reconcile(ctx: Context, body: dict[str, Any], replicas: Mapping[WorkloadRole, int] | None = None,
                    scaling: Sequence[status.Condition] | None = None) -> Outcome:
    """Make the children match ``body`` and write its status if that changed; ``replicas``: each role's count as
    the autoscaler set it (spec.autoscaling), instead of the spec's; ``scaling``: the autoscaler's conditions, for
    status.conditions."""
    owner = owner_of(body, ctx.defaults)
    if owner is None:
        return Outcome([], None)
    owner = with_replicas(owner, replicas)
    key = (owner.namespace, owner.name)
    jobs = {name: compile_jobs.JobView.of(job) for name, job in ctx.stores["Job"].owned_by(key).items()}
    served = await ctx.discovery.kinds() if owner.spec.routing.inference_pool.enabled else frozenset()
    built = {j.key for j in jobs.values() if j.state == "Succeeded"}
    wanted = build_children(owner, ctx.defaults, built, served, routed_before(ctx.stores, owner, body))
    changes = await converge(ctx, body, owner, wanted)
    verdict = routing.condition(owner, served)
    seen = status.Observation(
        body["metadata"].get("generation", 0), role_states(ctx.stores, owner, wanted), artifact_report(
            ctx.stores, owner, wanted, jobs), verdict, tuple(scaling or ()))
    new = status.compute(owner, seen, body.get("status"), now(), ctx.defaults.npu)
    again = routing.TTL if routing.waits_for_crd(verdict) else None
    if _same(new, body.get("status") or {}):
        return Outcome(changes, None, again)
    try:
        written = await ctx.kube.patch_status("AtomDeployment", owner.namespace, owner.name, {"status": new})
    except KubeError as e:
        if e.status == 404:  # deleted meanwhile: nothing left to report on
            return Outcome(changes, None)
        raise
    return Outcome(changes, written, again)


def owner_of(body: dict[str, Any], defaults: Defaults) -> Owner | None:
    """The AtomDeployment to build children from; None (said in the log) for one to leave alone."""
    meta = body["metadata"]
    try:
        spec = AtomDeployment.model_validate(body).spec
    except ValidationError as e:
        # The CRD's CEL rules and the webhook refuse such objects; one stored before them is left alone.
        log.warning("skip invalid AtomDeployment %s/%s: %s", meta["namespace"], meta["name"], e)
        return None
    refusals = fusion_refusals(spec, defaults.npu)
    if refusals:
        # The webhook refuses such specs; one admitted under another NPU profile is left as it is.
        log.warning("skip AtomDeployment %s/%s: %s", meta["namespace"], meta["name"], "; ".join(refusals))
        return None
    return Owner(meta["name"], meta["namespace"], meta["uid"], spec)


def routed_before(stores: Stores, owner: Owner, body: dict[str, Any]) -> bool:
    """Whether routing children may be left from an earlier reconcile (then those no longer wanted are removed):
    the status reported on them, or the picker is there. Without either, nothing is asked of kinds no informer
    watches."""
    picker = epp_name(owner)
    return routing.reported(body) is not None or any(
        stores[kind].get(owner.namespace, picker) is not None for kind in ("Deployment", "Service"))


def role_states(stores: Stores, owner: Owner, wanted: Children) -> tuple[status.RoleState, ...]:
    key = (owner.namespace, owner.name)
    pods = list(stores["Pod"].owned_by(key).values())
    hashes = {c["metadata"]["name"]: c["metadata"]["annotations"][APPLIED_HASH]
              for c in wanted.desired if c["kind"] == "Deployment"}
    states = []
    for role in ROLES:
        spec = owner.spec.decode if role == "decode" else owner.spec.prefill
        if role == "prefill" and spec.replicas == 0:
            continue  # not run: its status reports zeros
        name = workload_name(owner, role)
        states.append(status.RoleState(role, spec.replicas, stores["Deployment"].get(owner.namespace, name),
                                       hashes.get(name, ""), tuple(p for p in pods if p.role == role)))
    return tuple(states)


def artifact_report(
    stores: Stores, owner: Owner, wanted: Children, jobs: dict[str, compile_jobs.JobView]
) -> compile_jobs.Report | None:
    if not owner.spec.model.compile_cache:
        return None
    pods = stores["Pod"].owned_by((owner.namespace, owner.name)).values()
    return compile_jobs.report(owner, wanted, jobs, [(p.role, p.failure) for p in pods if p.failure])


async def converge(ctx: Context, body: dict[str, Any], owner: Owner, wanted: Children) -> list[apply.Change]:
    """Write what differs from the stores: the Services on their own, and beside them the ConfigMaps, then the
    Deployments (their pods read the settings at start) and the removals; each round concurrent.

    A Service does not hold up the pods: creating one allocates its cluster IP, the slowest write of all. A child
    of a kind no informer watches that its store lacks is read first, with GETs sent together. A child's Event is
    recorded as soon as it is written and posted in the background (:class:`atom_operator.events.Recorder`)."""
    ns, key = owner.namespace, (owner.namespace, owner.name)
    refs = [(c["kind"], c["metadata"]["name"]) for c in wanted.desired] + wanted.absent
    found = await asyncio.gather(
        *(apply.current(ctx.kube, ctx.stores[k], ns, n, ask=k in UNWATCHED) for k, n in refs)
    )
    now_ = dict(zip(refs, found, strict=True))
    for (kind, _), obj in now_.items():
        if kind in UNWATCHED and obj is not None:
            ctx.stores[kind].put(obj, key)  # asked once, not again every reconcile
    services = [c for c in wanted.desired if c["kind"] == "Service"]
    configs = [c for c in wanted.desired if c["kind"] == "ConfigMap"]
    workloads = [c for c in wanted.desired if c["kind"] not in ("Service", "ConfigMap")]
    writer = _Writer(ctx.events, body)

    def ensure(child: dict[str, Any]) -> Awaitable[apply.Change | None]:
        kind = child["kind"]
        return apply.ensure(ctx.kube, child, now_[kind, child["metadata"]["name"]], ctx.stores[kind], key)

    async def configs_then_workloads() -> None:
        await writer.round([ensure(c) for c in configs])
        await writer.round(
            [ensure(c) for c in workloads]
            + [apply.remove(ctx.kube, ctx.stores[kind], ns, name, now_[kind, name], owner.uid)
               for kind, name in wanted.absent]
        )

    failed = await asyncio.gather(
        writer.round([ensure(c) for c in services]), configs_then_workloads(), return_exceptions=True
    )
    for r in failed:
        if isinstance(r, BaseException):
            raise r
    return writer.changes


class _Writer:
    """The writes of one converge, in rounds, and the Events that tell of them."""

    def __init__(self, recorder: events.Recorder, body: dict[str, Any]) -> None:
        self.recorder, self.body = recorder, body
        self.changes: list[apply.Change] = []

    async def round(self, writes: list[Awaitable[apply.Change | None]]) -> None:
        # Every write of the round finishes, and those that went out are recorded with their Events, before the
        # first failure (if any) is raised and the reconcile retried.
        results = await asyncio.gather(*writes, return_exceptions=True)
        for r in results:
            if isinstance(r, apply.Change):
                self.changes.append(r)
                self.recorder.record(self.body, events.CHILD_REASONS[r.action], str(r), now())
        for r in results:
            if isinstance(r, BaseException):
                raise r


def _same(new: dict[str, Any], old: dict[str, Any]) -> bool:
    return all(old.get(k) == v for k, v in new.items())
