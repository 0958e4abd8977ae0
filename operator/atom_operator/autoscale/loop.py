"""The autoscaler's loop: scrape, decide, drain, and hand the replicas to the reconciler. Level-based.

It plugs into the operator through three small seams: it sees pods as the informers do (:class:`Fanout` feeds it
beside the controller), the reconciler asks it for each role's replicas (:meth:`Autoscaler.replicas`, applied by
:func:`with_replicas` before the children are built), and it asks the controller to reconcile a key again when
they changed. Everything it writes itself is on pods (the accepting label, the drain's annotations) and
``status.autoscaling``, a key no other writer touches, and only when what it decided changed (an idle operator
writes nothing; the words that describe the load are refreshed every ``WORDS_REFRESH_SECONDS``). Its conditions
(HPA's ScalingActive, ScalingLimited, AbleToScale) go in ``status.conditions`` beside Ready, where ``kubectl
describe`` and ``kubectl wait`` read them: the reconciler writes that list whole, so it asks the autoscaler for
them (:meth:`Autoscaler.conditions`) as it asks for the replicas. When only they changed, the autoscaler writes them
into that list itself, the other conditions as the watch saw them, guarded by that object's resourceVersion (a
conflict leaves the write to a reconcile): a reconcile for each change of a condition was most of an autoscaled
fleet's reconciles, none of which changed a child.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import ValidationError

from atom_operator import events
from atom_operator import status as owner_status
from atom_operator.api import GROUP, AtomDeployment, AtomDeploymentSpec
from atom_operator.autoscale import drain, observe, telemetry
from atom_operator.autoscale.decision import Condition, Decision, RoleDecision, State, decide
from atom_operator.autoscale.policy import policy
from atom_operator.autoscale.scrape import CONCURRENCY, Sample, scrape
from atom_operator.children.meta import ACCEPTING, ROLES, Owner, WorkloadRole, workload_name
from atom_operator.kube import Kube, KubeError, TransientError

log = logging.getLogger(__name__)
Key = tuple[str, str]

DRAINING_SINCE = f"{GROUP}/draining-since"  # seconds since the epoch the pod was cordoned
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LOWEST_COST = str(-(2**31))  # the ReplicaSet removes the lowest cost first
METRICS_PORT = 9090  # the pods' metrics port (children/workload.py)
TICK_SECONDS = 1.0
UNCORDONED = {"labels": {ACCEPTING: "true"}, "annotations": {DRAINING_SINCE: None, DELETION_COST: None}}
# HPA's condition names, in status.conditions while spec.autoscaling is on.
CONDITION_TYPES = ("ScalingActive", "ScalingLimited", "AbleToScale")
# A pod the scheduler could not place for this long is taken for a full cluster, not for a node on its way (the
# design's section 4, step 4).
UNSCHEDULABLE_SECONDS = 60.0
# Fields of status.autoscaling that change with every decision: a write is due only when something else changed.
STAMPS = ("lastDecisionTime",)
# Its words (each role's demand, the reason) and the conditions' messages follow every reading (a load to one
# decimal) where the counts, the statuses and the reasons do not: written at once when those change, the words
# only refreshed this often. Written with every decision, a fleet of 100 wrote its status twice a decision, and
# each change of the conditions was a reconcile asked for (benchmarks/results/autoscaling-fleet.md).
WORDS = ("demand", "reason")
WORDS_REFRESH_SECONDS = 30.0


def with_replicas(owner: Owner, replicas: Mapping[WorkloadRole, int] | None) -> Owner:
    """``owner`` with each role's replicas as the autoscaler set them (unchanged without)."""
    if not replicas:
        return owner
    spec = owner.spec
    update = {role: getattr(spec, role).model_copy(update={"replicas": n}) for role, n in replicas.items()}
    return Owner(owner.name, owner.namespace, owner.uid, spec.model_copy(update=update))


@dataclass(frozen=True)
class PodInfo:
    name: str
    role: str
    ip: str | None
    ready: bool
    created: float
    cordoned_since: float | None
    cost_applied: bool
    unschedulable_since: float | None = None  # the scheduler found no node for it (PodScheduled False) since

    @classmethod
    def of(cls, body: dict[str, Any]) -> PodInfo:
        meta, status = body["metadata"], body.get("status") or {}
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        since = None
        if labels.get(ACCEPTING) == "false":
            try:
                since = float(notes.get(DRAINING_SINCE, ""))
            except ValueError:
                since = 0.0  # cordoned by hand or by an older operator: its drain counts as long begun
        unschedulable = next(
            (_epoch(c.get("lastTransitionTime")) for c in status.get("conditions") or []
             if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"),
            None,
        )  # fmt: skip
        return cls(
            meta["name"],
            labels.get("app.kubernetes.io/component", ""),
            status.get("podIP"),
            ready,
            _epoch(meta.get("creationTimestamp")),
            since,
            notes.get(DELETION_COST) == LOWEST_COST,
            unschedulable,
        )


def _turned_away(pods: Iterable[PodInfo], role: str, now: float) -> dict[str, int]:
    """A role's pods the scheduler found no node for: for UNSCHEDULABLE_SECONDS or more, and for less."""
    ages = [now - p.unschedulable_since for p in pods if p.role == role and p.unschedulable_since is not None]
    return {
        "unschedulable": sum(age >= UNSCHEDULABLE_SECONDS for age in ages),
        "newly_unschedulable": sum(age < UNSCHEDULABLE_SECONDS for age in ages),
    }


def _epoch(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Tracked:
    state: State = field(default_factory=State)
    replicas: dict[WorkloadRole, int] = field(default_factory=dict)  # what the Deployments are to carry
    desired: dict[WorkloadRole, int] = field(default_factory=dict)  # the last decision
    decided_at: float = float("-inf")
    samples: dict[str, Sample] = field(default_factory=dict)  # pod -> its last scrape
    drains: set[str] = field(default_factory=set)
    conditions: tuple[Condition, ...] = ()  # the last decision's, for the reconciler's status.conditions
    conditions_at: float = float("-inf")  # when they were last taken for it
    written: dict[str, Any] | None = None  # status.autoscaling as last written, without STAMPS
    written_at: float = float("-inf")


def _content(autoscaling: dict[str, Any] | None, words: bool = True) -> dict[str, Any]:
    """status.autoscaling as compared for a write: no per-decision stamps, no nulls (a merge patch drops them);
    without ``words``, only what a decision decided (no demand, no reason)."""
    dropped = STAMPS if words else STAMPS + WORDS

    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if x is not None and k not in dropped}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return clean(autoscaling or {})


def _as_status(conditions: tuple[Condition, ...]) -> tuple[owner_status.Condition, ...]:
    """The decision's conditions as status computes and stamps them."""
    return tuple(owner_status.Condition(c.type, c.status == "True", c.reason, c.message) for c in conditions)


def _decided(conditions: tuple[Condition, ...]) -> tuple[tuple[str, str, str], ...]:
    """What the conditions say without their messages."""
    return tuple((c.type, c.status, c.reason) for c in conditions)


def direction(role: str, r: RoleDecision, d: Decision) -> str:
    """What a decision did to a role: a new desired count up or down, or none (also while a drain carries out an
    earlier one, when desired stays below current for several decisions)."""
    if role not in d.scaled or r.desired == r.current:
        return "none"
    return "up" if r.desired > r.current else "down"


class Autoscaler:
    def __init__(self, kube: Kube, owners: Mapping[Key, dict[str, Any]],
                 deployment: Callable[[str, str], dict[str, Any] | None], enqueue: Callable[[Key], None],
                 *, port: int = METRICS_PORT, coupled: bool = True, clock: Callable[[], float] = time.time,
                 npus: Callable[[], int | None] = lambda: None) -> None:  # fmt: skip
        self.kube, self.owners, self.deployment, self.enqueue = kube, owners, deployment, enqueue
        self.port, self.coupled, self.clock = port, coupled, clock
        self.npus = npus  # the cluster's allocatable NPUs (the node informer's): a node joining re-reads the room
        self.pods: dict[Key, dict[str, PodInfo]] = {}
        # Pods being deleted (name -> role) until they are gone: they still hold their NPUs, which a pod Pending
        # as unschedulable meanwhile waits for; the cluster's room counts them.
        self.terminating: dict[Key, dict[str, str]] = {}
        self.tracked: dict[Key, _Tracked] = {}
        self._session: aiohttp.ClientSession | None = None
        self._gate: asyncio.Semaphore | None = None

    # ---- the informers' pods (through Fanout) -------------------------------------------------------------
    def event(self, kind: str, type_: str | None, body: dict[str, Any], key: Key) -> None:
        if kind != "Pod":
            return
        pods = self.pods.setdefault(key, {})
        terminating = self.terminating.setdefault(key, {})
        name = body["metadata"]["name"]
        if type_ == "DELETED":
            pods.pop(name, None)
            terminating.pop(name, None)
        elif body["metadata"].get("deletionTimestamp"):
            pods.pop(name, None)
            terminating[name] = PodInfo.of(body).role
        else:
            pods[name] = PodInfo.of(body)

    def relisted(self, listing: Any) -> None:
        if listing.kind == "Pod":
            for pods in self.pods.values():
                pods.clear()
            self.terminating.clear()
            for body, key in listing.items:
                self.event("Pod", None, body, key)

    # ---- the reconciler's question -------------------------------------------------------------------------
    def replicas(self, key: Key) -> dict[WorkloadRole, int] | None:
        """Each role's count for the children: the autoscaler's; before its first step, what the Deployments have
        (a spec change must not lower them past the drain, e.g. an HPA's write in External mode)."""
        tracked = self.tracked.get(key)
        if tracked and tracked.replicas:
            return dict(tracked.replicas)
        autoscaling = ((self.owners.get(key) or {}).get("spec") or {}).get("autoscaling") or {}
        if autoscaling.get("mode") not in ("Operator", "External"):
            return None
        held = {}
        for role in ROLES:
            deployment = self.deployment(key[0], f"{key[1]}-{role}")
            if deployment is not None and "replicas" in deployment.get("spec", {}):
                held[role] = int(deployment["spec"]["replicas"])
        return held or None

    def conditions(self, key: Key) -> tuple[owner_status.Condition, ...] | None:
        """HPA's conditions for the reconciler's status.conditions; None while autoscaling is off. Before the first
        decision after a start, those status has (a restart does not drop them and stamp them anew)."""
        tracked = self.tracked.get(key)
        if tracked and tracked.conditions:
            return _as_status(tracked.conditions)
        body = self.owners.get(key) or {}
        autoscaling = (body.get("spec") or {}).get("autoscaling") or {}
        if autoscaling.get("mode") not in ("Operator", "External"):
            return None
        return tuple(
            owner_status.Condition(c["type"], c.get("status") == "True", c.get("reason") or "", c.get("message") or "")
            for c in ((body.get("status") or {}).get("conditions") or [])
            if c.get("type") in CONDITION_TYPES
        )

    # ---- the loop ------------------------------------------------------------------------------------------
    async def run(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY))
        self._gate = asyncio.Semaphore(CONCURRENCY)
        try:
            while True:
                started = time.monotonic()
                keys = list(self.owners)
                await asyncio.gather(*(self._guarded(k) for k in keys))
                for gone in [k for k in self.tracked if k not in self.owners]:
                    del self.tracked[gone]
                    telemetry.forget(gone)
                await asyncio.sleep(max(0.0, TICK_SECONDS - (time.monotonic() - started)))
        finally:
            await self._session.close()

    async def _guarded(self, key: Key) -> None:
        try:
            await self.step(key)
        except Exception:  # noqa: BLE001 - one deployment's trouble never stops the others' autoscaling
            log.exception("autoscale %s/%s failed", *key)

    async def step(self, key: Key) -> None:
        body = self.owners.get(key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        pods = self.pods.get(key, {})
        if "autoscaling" not in (body.get("spec") or {}) and key not in self.tracked:
            # Never autoscaled (the common case, checked without parsing): only a cordon left behind needs undoing.
            await self._uncordon(key, [p for p in pods.values() if p.cordoned_since is not None or p.cost_applied])
            return
        try:
            spec = AtomDeployment.model_validate(body).spec
        except ValidationError:
            return
        if spec.autoscaling is None or spec.autoscaling.mode == "Off":
            # Level-based: nothing stays cordoned once autoscaling is off, and the spec's replicas apply again.
            await self._uncordon(key, [p for p in pods.values() if p.cordoned_since is not None or p.cost_applied])
            if self.tracked.pop(key, None) is not None:
                telemetry.forget(key)
                self.enqueue(key)
            return
        await self._autoscale(key, body, spec, pods)

    async def _autoscale(self, key: Key, body: dict[str, Any], spec: AtomDeploymentSpec,
                         pods: Mapping[str, PodInfo]) -> None:  # fmt: skip
        tracked = self.tracked.setdefault(key, _Tracked())
        a = spec.autoscaling
        assert a is not None
        roles = [r for r in ROLES if r == "decode" or spec.prefill.replicas > 0 or a.prefill is not None]
        telemetry.watch(key, roles)
        now = self.clock()
        current = {role: self._current(key, spec, role, tracked) for role in roles}
        due = now - tracked.decided_at >= a.interval_seconds
        draining = any(p.cordoned_since is not None or p.cost_applied for p in pods.values())
        moving = any(tracked.desired.get(role, current[role]) != current[role] for role in roles)
        if not (due or draining or moving):
            return  # between decisions and with no drain to follow, the pods are scraped once an interval
        ready = {p.name: p for p in pods.values() if p.ready and p.ip}
        urls = {n: f"http://{p.ip}:{self.port}/metrics" for n, p in ready.items()}
        assert self._session is not None
        began = time.monotonic()
        found = await scrape(self._session, urls, gate=self._gate)
        telemetry.SCRAPE_SECONDS.observe(time.monotonic() - began)
        telemetry.SCRAPE_ERRORS.inc(sum(s is None for s in found.values()))
        readings = {
            role: observe.RoleReading(
                current[role],
                [observe.PodReading(p.name, p.name in ready, p.cordoned_since is not None, found.get(p.name),
                                    tracked.samples.get(p.name)) for p in pods.values() if p.role == role],  # fmt: skip
                rolling_out=self._rolling_out(key, role),
                **_turned_away(pods.values(), role, now),
                terminating=sum(r == role for r in self.terminating.get(key, {}).values()),
            )  # fmt: skip
            for role in roles
        }
        if due:
            tracked.samples = {n: s for n, s in found.items() if s is not None}
            external = spec.decode.replicas if a.mode == "External" else None
            rules = policy(spec, coupled=self.coupled)
            obs = observe.observations(readings["decode"], readings.get("prefill"), external, self.npus(), rules.lanes)
            decision = decide(obs, tracked.state, rules, now)
            tracked.state, tracked.decided_at = decision.state, now
            tracked.desired = {"decode": decision.decode.desired}
            if decision.prefill is not None:
                tracked.desired["prefill"] = decision.prefill.desired
            self._record(key, decision)
        changed = False
        if due and tracked.conditions != decision.conditions and (
            _decided(tracked.conditions) != _decided(decision.conditions)
            or now - tracked.conditions_at >= WORDS_REFRESH_SECONDS
        ):
            tracked.conditions, tracked.conditions_at = decision.conditions, now
            changed = True  # unless the status write below carries them
        if due:
            changed = not await self._post_status(key, decision, now, changed) and changed
        for role in roles:
            desired = tracked.desired.get(role, current[role])
            states = [
                drain.PodState(p.name, p.name in ready, (found.get(p.name) or Sample(0, {})).values.get(
                    observe.IN_FLIGHT), observe.idle(found.get(p.name)), p.created, p.cordoned_since, p.cost_applied)
                for p in pods.values() if p.role == role
            ]  # fmt: skip
            step = drain.plan(states, current[role], desired, now, float(a.drain.timeout_seconds))
            await self._act(key, body, role, step, now)
            if tracked.replicas.get(role) != step.replicas:
                tracked.replicas[role] = step.replicas
                changed = True
        if changed:
            self.enqueue(key)

    def _current(self, key: Key, spec: AtomDeploymentSpec, role: WorkloadRole, tracked: _Tracked) -> int:
        if role in tracked.replicas:
            return tracked.replicas[role]
        # After a start: what the Deployment has (a drain or a decision of the last run), else the spec's count.
        deployment = self.deployment(key[0], workload_name(Owner(key[1], key[0], "", spec), role))
        if deployment is not None and "replicas" in deployment.get("spec", {}):
            return int(deployment["spec"]["replicas"])
        return getattr(spec, role).replicas

    def _rolling_out(self, key: Key, role: WorkloadRole) -> bool:
        deployment = self.deployment(key[0], f"{key[1]}-{role}")
        status = (deployment or {}).get("status") or {}
        return status.get("updatedReplicas", 0) < status.get("replicas", 0)

    # ---- writes ------------------------------------------------------------------------------------------
    async def _patch_pod(self, namespace: str, name: str, meta: dict[str, Any]) -> None:
        path = self.kube.resource("Pod").path(name, namespace)
        try:
            await self.kube.request("PATCH", path, body={"metadata": meta},
                                    content_type="application/merge-patch+json")  # fmt: skip
        except KubeError as e:
            if e.status != 404:  # gone meanwhile: nothing to cordon
                raise

    async def _uncordon(self, key: Key, pods: list[PodInfo]) -> None:
        for p in pods:
            await self._patch_pod(key[0], p.name, UNCORDONED)

    async def _act(self, key: Key, body: dict[str, Any], role: WorkloadRole, step: drain.Plan, now: float) -> None:
        ns = key[0]
        tracked = self.tracked[key]
        for name in step.cordon:
            await self._patch_pod(ns, name, {"labels": {ACCEPTING: "false"},
                                             "annotations": {DRAINING_SINCE: f"{now:.3f}"}})  # fmt: skip
            await self._event(body, "DrainStarted", f"{role} pod {name} cordoned: no new requests, deleted once idle")
        for name in step.uncordon:
            await self._patch_pod(ns, name, UNCORDONED)
            if name in tracked.drains:
                await self._event(body, "DrainCancelled", f"{role} pod {name} accepts requests again")
        for name in step.mark:
            await self._patch_pod(ns, name, {"annotations": {DELETION_COST: LOWEST_COST}})
            since = self.pods.get(key, {}).get(name)
            if since is not None and since.cordoned_since is not None:
                telemetry.DRAIN_SECONDS.labels(role).observe(max(0.0, now - since.cordoned_since))
            timed_out = name in step.timed_out
            if timed_out:
                telemetry.DRAIN_TIMEOUTS.labels(*key, role).inc()
            await self._event(body, "DrainTimedOut" if timed_out else "DrainFinished",
                              f"{role} pod {name} {'still busy after the drain timeout' if timed_out else 'idle'};"
                              " it goes next", warning=timed_out)  # fmt: skip
        tracked.drains = (tracked.drains - set(step.uncordon)) | set(step.draining)

    def _record(self, key: Key, d: Decision) -> None:
        for role, r in (("decode", d.decode), ("prefill", d.prefill)):
            if r is None:
                continue
            telemetry.DESIRED.labels(*key, role).set(r.desired)
            telemetry.RECOMMENDED.labels(*key, role).set(r.recommended)
            if r.load is not None:
                telemetry.DEMAND.labels(*key, role).set(r.load)
            telemetry.DECISIONS.labels(role, direction(role, r, d)).inc()

    async def _post_status(self, key: Key, d: Decision, now: float, with_conditions: bool) -> bool:
        """status.autoscaling where it changed, and HPA's conditions into status.conditions where
        ``with_conditions``, in one write; whether the conditions were written (else the reconciler writes them)."""
        tracked = self.tracked[key]
        roles = {}
        pods = self.pods.get(key, {}).values()
        for role, r in (("decode", d.decode), ("prefill", d.prefill)):
            if r is None:
                continue
            last = tracked.state.last_scale.get(role)
            roles[role] = {
                "desiredReplicas": r.desired,
                "recommendedReplicas": r.recommended,
                "drainingPods": sum(p.role == role and p.cordoned_since is not None for p in pods),
                "lastScaleTime": _rfc3339(last) if last is not None else None,
                "demand": r.demand[:256],
            }
        # "conditions": None removes the list an earlier operator kept here (they are in status.conditions now).
        status = {"lastDecisionTime": _rfc3339(now), **roles, "reason": d.reason[:1024], "conditions": None,
                  "currentRatio": f"{d.prefill.desired}:{d.decode.desired}" if d.prefill else None}  # fmt: skip
        content = _content(status)
        stored = ((self.owners.get(key) or {}).get("status") or {}).get("autoscaling")
        decided = _content(status, words=False)
        words_only = decided in (_content(tracked.written, words=False), _content(stored, words=False))
        due = content not in (tracked.written, _content(stored)) and (
            not words_only or now - tracked.written_at >= WORDS_REFRESH_SECONDS
        )
        patch: dict[str, Any] = {"status": {"autoscaling": status}} if due else {"status": {}}
        conditions = self._conditions_patch(key, d.conditions, now) if with_conditions else None
        carried = False  # the conditions went out, status.autoscaling with them where due
        if conditions:
            patch["metadata"], patch["status"]["conditions"] = conditions
            try:
                await self.kube.patch_status("AtomDeployment", *key, patch)
                carried = True
            # A conflict (409, which Kube raises as a TransientError) the most likely: the object moved since the
            # watch saw it (the reconciler's own status write, say).
            except (KubeError, TransientError) as e:
                log.debug("status.conditions of %s/%s left to the reconciler: %s", *key, e)
                del patch["metadata"], patch["status"]["conditions"]
        if due and not carried:
            try:
                await self.kube.patch_status("AtomDeployment", *key, patch)
            except KubeError as e:
                if e.status != 404:
                    raise
                due = False  # the object is gone: nothing was written
            except TransientError as e:
                # The decision stands (its replicas are applied, its Event posted below); the next one writes it.
                log.warning("status.autoscaling of %s/%s left to the next decision: %s", *key, e)
                due = False
        if due:
            tracked.written, tracked.written_at = content, now
        if d.scaled:
            body = self.owners.get(key)
            if body is not None:
                up = any(r is not None and r.desired > r.current for r in (d.decode, d.prefill))
                await self._event(body, "ScaledUp" if up else "ScaledDown", d.reason[:1024])
        return carried or conditions == ()  # (): status has them already (a restarted operator's first decision)

    def _conditions_patch(
        self, key: Key, conditions: tuple[Condition, ...], now: float
    ) -> tuple[dict[str, Any], list[dict[str, Any]]] | tuple[()] | None:
        """status.conditions with HPA's replaced, the others as the watch saw them, and the resourceVersion that
        guards the write (the API server refuses it if the object moved since); () where status holds them
        already, None without a resourceVersion."""
        body = self.owners.get(key) or {}
        meta = body.get("metadata") or {}
        if not meta.get("resourceVersion"):
            return None
        stored = [c for c in (body.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]
        previous = {c["type"]: c for c in stored if "type" in c}
        generation = int(meta.get("generation") or 0)
        ours = [c.stamped(generation, previous, _rfc3339(now)) for c in _as_status(conditions)]
        # The reconciler's order: its own conditions first, HPA's last.
        merged = [c for c in stored if c.get("type") not in CONDITION_TYPES] + ours
        if merged == stored:
            return ()
        return {"resourceVersion": meta["resourceVersion"]}, merged

    async def _event(self, owner: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        # Awaited, unlike the reconciler's (events.Recorder): a few per scale or drain step, on a loop that waits on
        # the API server for its own writes anyway.
        await events.post(self.kube, events.build_event(owner, reason, message, _rfc3339(self.clock()), warning))


class Fanout:
    """An informer sink feeding the controller and the autoscaler the same events."""

    def __init__(self, *sinks: Any) -> None:
        self.sinks = sinks

    def event(self, kind: str, type_: str | None, body: dict[str, Any], key: Key) -> None:
        for s in self.sinks:
            s.event(kind, type_, body, key)

    def relisted(self, listing: Any) -> None:
        for s in self.sinks:
            s.relisted(listing)
