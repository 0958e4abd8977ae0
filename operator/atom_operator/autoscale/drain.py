"""Scale-down without failed requests: which pods to cordon, which to release, and the replicas to set. No I/O.

A role shrinks from ``replicas`` to ``desired`` pod by pod:

1. **Victims**: pods not Ready first (still starting: nothing in flight, nothing to drain), then pods already
   cordoned (a drain resumes after a restart: the label and its time are on the pod), then the Ready pod with the
   least in flight, ties to the newest. Not Ready before cordoned, as the ReplicaSet ranks them (not Ready before
   any deletion cost): a not-Ready pod left out while a drained one is released would be the one it removes.
2. **Cordon**: the pod's accepting label goes "false", so the Services and the InferencePool (whose selectors carry
   it) stop sending it work; it keeps serving what it has.
3. **Idle**: once its engine reports nothing in flight (after endpoints had time to drop it), or the drain timed
   out, it gets the lowest ``controller.kubernetes.io/pod-deletion-cost``. A victim not Ready has nothing to wait
   for: it is cordoned and marked in the same interval (cordoned all the same, so that turning Ready meanwhile
   brings it no request).
4. **Release**: only victims whose cost the operator has seen applied count toward lowering the Deployment's
   replicas, so the ReplicaSet, ranking by that cost, removes exactly them; a Ready victim only once every
   not-Ready victim is released too (the ReplicaSet would take a not-Ready pod first).

Level-based: every pod that is not a victim is un-cordoned and loses the cost, so load returning during a drain
(``desired`` back up), turning autoscaling off, or a restart that finds another decision never leaves one behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Endpoint slices, kube-proxy and the EPP drop a cordoned pod within about a second; a pod reporting idle sooner
# may still get a request routed meanwhile.
SETTLE_SECONDS = 3.0


@dataclass(frozen=True)
class PodState:
    name: str
    ready: bool
    in_flight: float | None  # requests on its API routes (None: unknown, it did not answer)
    idle: bool  # its engine reports nothing in flight
    created: float  # for ties: the newest goes first
    cordoned_since: float | None = None  # its accepting label is "false" since then
    cost_applied: bool = False  # the lowest deletion cost is on it (as the watch saw it)


@dataclass(frozen=True)
class Plan:
    replicas: int  # the Deployment's replicas to set now
    cordon: tuple[str, ...] = ()
    uncordon: tuple[str, ...] = ()  # label back to "true" and the cost removed
    mark: tuple[str, ...] = ()  # idle (or timed out) victims: give them the lowest deletion cost
    timed_out: tuple[str, ...] = ()  # of the marked, those released because the drain timed out
    draining: tuple[str, ...] = ()  # every victim still on its way out


def _order(p: PodState) -> tuple:
    return (p.ready, p.cordoned_since is None, p.in_flight if p.in_flight is not None else float("inf"), -p.created)


def plan(pods: Sequence[PodState], replicas: int, desired: int, now: float, timeout: float) -> Plan:
    """What to do this interval for one role, whose Deployment asks for ``replicas`` and the decision for
    ``desired``."""
    surplus = max(0, replicas - desired)
    victims = sorted(pods, key=_order)[:surplus]
    chosen = {p.name for p in victims}
    uncordon = tuple(p.name for p in pods if p.name not in chosen and (p.cordoned_since is not None or p.cost_applied))
    if surplus == 0:
        return Plan(replicas=desired, uncordon=uncordon)  # growing (or level): at once, and no drain is wanted
    cordon = tuple(p.name for p in victims if p.cordoned_since is None)
    mark, timed_out, released = [], [], []
    for p in victims:
        if p.cordoned_since is None and p.ready:
            continue  # cordoned this interval; its drain starts now
        waited = now - p.cordoned_since if p.cordoned_since is not None else 0.0
        done = (not p.ready) or (p.idle and p.in_flight == 0 and waited >= SETTLE_SECONDS)
        late = waited >= timeout
        if done or late:
            if p.cost_applied and p.cordoned_since is not None:
                released.append(p)
            elif not p.cost_applied:
                mark.append(p.name)
                if late and not done:
                    timed_out.append(p.name)
    if any(not p.ready and p not in released for p in victims):
        released = [p for p in released if not p.ready]  # the ReplicaSet would remove the not-Ready one instead
    return Plan(
        replicas=replicas - len(released),
        cordon=cordon,
        uncordon=uncordon,
        mark=tuple(mark),
        timed_out=tuple(timed_out),
        draining=tuple(p.name for p in victims),
    )
