"""What the cluster showed it can place, remembered for a while; and what each role claims of it. No I/O.

Once pods stay Pending as unschedulable, the units of the pods the cluster placed bound the pairs the decision asks
for (:mod:`.share`), so nothing asks for pods that cannot run. The reading lapses and is probed again, less often
each time the probe finds no more room, and at once when the cluster's NPUs grow (a node joined).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from atom_operator.autoscale.observations import Observations, RoleObservation
from atom_operator.autoscale.policy import Policy

# How long what the cluster could place bounds the pairs after pods stayed unschedulable; each probe that finds no
# more room doubles it, up to the longest.
CAPACITY_MEMORY_SECONDS = 300.0
CAPACITY_MEMORY_LONGEST_SECONDS = 1200.0


@dataclass(frozen=True)
class Room:
    """What the cluster showed it can place: the units of the pods it placed while some stayed unschedulable."""

    units: int
    until: float  # the pairs stay within ``units`` until then
    memory: float = CAPACITY_MEMORY_SECONDS  # how long this reading bounds the pairs after stuck pods were last seen
    npus: int | None = None  # the cluster's allocatable NPUs when it was read (None: not known)

    def holds(self, now: float) -> bool:
        return now < self.until


def units(policy: Policy, prefill: int, decode: int) -> int:
    """What the cluster's room is counted in: NPUs, a pod that requests none (the cpu backend) counting as one."""
    return prefill * (policy.npus_prefill or 1) + decode * (policy.npus_decode or 1)


def learn(obs: Observations, last: Room | None, policy: Policy, now: float) -> Room | None:
    """The room the cluster showed: the units of the pods it placed, while some of this deployment's stay Pending.

    Once the reading lapses the decision asks for what the targets need again (a probe). A probe that finds no
    more room than before doubles how long the reading lasts, up to ``CAPACITY_MEMORY_LONGEST_SECONDS``; more room
    resets it. A node that is not coming costs a Pending pod every five minutes otherwise, and each one counts
    toward its role's target.

    A pod counts as stuck once the scheduler has found no node for it for ``UNSCHEDULABLE_SECONDS`` (the loop's),
    which leaves a cluster autoscaler time to add one. A probe's pods count at the scheduler's first no: a probe
    asks whether room was freed since, which that attempt answers; a node the autoscaler adds later shows as the
    cluster's allocatable NPUs growing, which lapses the reading at once. Waiting the minute for a probe's pod kept
    it in its role's target for that minute. A reading that lapsed as
    long ago as it held is forgotten: pods Pending then are read as the first ones were, with the minute."""
    if last is not None and now >= last.until + last.memory:
        last = None  # lapsed for as long as it held, and not probed: pods Pending now are read afresh
    if last is not None and last.npus is not None and obs.npus is not None and obs.npus > last.npus:
        last = replace(last, until=min(last.until, now), npus=obs.npus)  # a node joined: probe now
    probing = last is not None and not last.holds(now)
    if not stuck_pods(obs, probing):
        return last
    # What holds NPUs now: the pods placed and those still terminating (a stuck pod may be waiting for one).
    # The latest reading replaces an older one: the cluster may have grown or shrunk since.
    p, d = obs.prefill, obs.decode
    placed = units(
        policy,
        p.replicas - _stuck(p, probing) + p.terminating if p else 0,
        d.replicas - _stuck(d, probing) + d.terminating,
    )
    memory = CAPACITY_MEMORY_SECONDS
    if last is not None and placed <= last.units:
        memory = min(CAPACITY_MEMORY_LONGEST_SECONDS, last.memory * 2) if probing else last.memory
    return Room(placed, now + memory, memory, obs.npus)


def stuck_pods(obs: Observations, probing: bool) -> int:
    """The pods taken for ones the cluster cannot place: while probing, any the scheduler found no node for."""
    return _stuck(obs.decode, probing) + (_stuck(obs.prefill, probing) if obs.prefill else 0)


def _stuck(role: RoleObservation, probing: bool) -> int:
    return role.unschedulable + (role.newly_unschedulable if probing else 0)


def claim(stable: int, recommended: int, obs: RoleObservation) -> int:
    """What a role asks of the room: its stabilized count, less the pods its down window keeps beyond its
    recommendation that the cluster has not placed. The window keeps pods that serve while a lower reading may yet
    pass; a pod stuck Pending serves nothing, and sharing the room for it gave up the other role's Ready pod for a
    pod that never ran."""
    if stable <= recommended:
        return stable
    return min(stable, max(recommended, obs.replicas - obs.unschedulable))
