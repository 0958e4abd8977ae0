"""``AtomDeployment.status`` from what the watches saw of the child Deployments and pods (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from atom_operator.children import Owner, endpoint
from atom_operator.children.meta import APPLIED_HASH, ROLES, WorkloadRole, selector_string
from atom_operator.compile_jobs import Report, failure_of
from atom_operator.npu import DEFAULT_PROFILE, NpuProfile


@dataclass(frozen=True)
class PodView:
    """What status needs of one pod; kept per pod in memory, so small."""

    role: str
    pending: bool
    unschedulable: str | None  # the scheduler's message while it cannot place the pod
    failure: str | None = None  # what a failed container left (compile pods: the ArtifactReady message)

    @classmethod
    def of(cls, pod: dict[str, Any]) -> PodView:
        labels = pod["metadata"].get("labels") or {}
        status = pod.get("status") or {}
        message = next(
            (
                c.get("message") or c.get("reason") or "Unschedulable"
                for c in status.get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
            ),
            None,
        )
        return cls(
            labels.get("app.kubernetes.io/component", ""), status.get("phase") == "Pending", message, failure_of(pod)
        )


_INSUFFICIENT = re.compile(r"Insufficient ([\w./-]*\w)")


def role_counts(deployment: dict[str, Any] | None) -> dict[str, int]:
    status = (deployment or {}).get("status") or {}
    return {
        "replicas": status.get("replicas", 0),
        "readyReplicas": status.get("readyReplicas", 0),
        "updatedReplicas": status.get("updatedReplicas", 0),
    }


def rolled_out(deployment: dict[str, Any] | None, desired: int, applied_hash: str) -> bool:
    """The Deployment runs what we last applied, with exactly ``desired`` up-to-date ready pods."""
    if deployment is None:
        return False
    meta, status = deployment["metadata"], deployment.get("status") or {}
    counts = role_counts(deployment)
    return (
        (meta.get("annotations") or {}).get(APPLIED_HASH) == applied_hash
        and status.get("observedGeneration", 0) >= meta.get("generation", 0)
        and counts["replicas"] == counts["updatedReplicas"] == counts["readyReplicas"] == desired
    )


def pending_message(
    owner: Owner, role: WorkloadRole, pods: list[PodView], profile: NpuProfile = DEFAULT_PROFILE
) -> str | None:
    """E.g. "decode: 2 of 3 pods Pending: insufficient rebellions.ai/npu (each needs 4)"."""
    mine = [p for p in pods if p.role == role]
    stuck = [p for p in mine if p.pending and p.unschedulable]
    if not stuck:
        return None
    spec = owner.spec.decode if role == "decode" else owner.spec.prefill
    npu = profile.resource(spec.backend)
    short = sorted({r for p in stuck for r in _INSUFFICIENT.findall(p.unschedulable or "")})
    if short:
        why = ", ".join(
            f"insufficient {r}" + (f" (each needs {spec.npus_per_replica})" if r == npu else "") for r in short
        )
    else:
        why = (stuck[0].unschedulable or "").split(". preemption:")[0].strip()
    return f"{role}: {len(stuck)} of {len(mine)} pods Pending: {why}"


@dataclass(frozen=True)
class Condition:
    """One condition as computed: ``ok`` is its status True or False."""

    type: str
    ok: bool
    reason: str
    message: str

    def stamped(self, generation: int, old: dict[str, dict[str, Any]], now: str) -> dict[str, Any]:
        """As status holds it (a metav1.Condition): the transition time moves only when the status does."""
        status = "True" if self.ok else "False"
        previous = old.get(self.type)
        since = previous["lastTransitionTime"] if previous and previous.get("status") == status else now
        return {
            "type": self.type,
            "status": status,
            "observedGeneration": generation,
            "lastTransitionTime": since,
            "reason": self.reason,
            "message": self.message,
        }


@dataclass(frozen=True)
class RoleState:
    """One role as the watches show it: its Deployment, the hash of what we want it to run, and its pods."""

    role: WorkloadRole
    desired: int  # replicas the spec asks for
    deployment: dict[str, Any] | None  # the child Deployment as the store has it (None: not made, or withheld)
    applied_hash: str  # of the Deployment we want; "" while it is withheld (compileCache: no artifact yet)
    pods: tuple[PodView, ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        return role_counts(self.deployment)

    def rolled_out(self) -> bool:
        return rolled_out(self.deployment, self.desired, self.applied_hash)

    def progress(self) -> str:
        updated, ready = self.counts["updatedReplicas"], self.counts["readyReplicas"]
        return f"{self.role}: {updated} of {self.desired} pods updated, {ready} ready"

    def failures(self, owner: Owner, profile: NpuProfile) -> list[str]:
        """Why pods cannot run: Pending for lack of room, or a ReplicaFailure the Deployment reports."""
        out = [m] if (m := pending_message(owner, self.role, list(self.pods), profile)) else []
        for c in (self.deployment or {}).get("status", {}).get("conditions") or []:
            if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
                out.append(f"{self.role}: {c.get('message') or c.get('reason')}")
        return out


@dataclass(frozen=True)
class Observation:
    """Everything status is computed from, gathered by the reconcile."""

    generation: int
    roles: tuple[RoleState, ...]  # the roles the spec runs (decode, then prefill when it has replicas)
    artifact: Report | None = None  # the compile Jobs' report (spec.model.compileCache only)
    routing: Condition | None = None  # the InferencePool condition (spec.routing.inferencePool only)
    scaling: tuple[Condition, ...] = ()  # HPA's ScalingActive, ScalingLimited, AbleToScale (spec.autoscaling only)


def compute(
    owner: Owner, seen: Observation, old: dict[str, Any] | None, now: str, profile: NpuProfile = DEFAULT_PROFILE
) -> dict[str, Any]:
    """The whole status; ``old`` keeps conditions' transition times, ``now`` stamps new transitions."""
    out: dict[str, Any] = {"observedGeneration": seen.generation}
    for role in ROLES:  # a role not run reports zeros
        state = next((s for s in seen.roles if s.role == role), None)
        counts = state.counts if state else role_counts(None)
        desired = (owner.spec.decode if role == "decode" else owner.spec.prefill).replicas
        out[role] = {**counts, "summary": summary(counts["readyReplicas"], desired)}
    previous = {c["type"]: c for c in (old or {}).get("conditions") or [] if "type" in c}
    conditions = [*rollout_conditions(owner, seen, profile), *filter(None, [artifact_condition(seen.artifact),
                                                                             seen.routing]), *seen.scaling]
    out["conditions"] = [c.stamped(seen.generation, previous, now) for c in conditions]
    if seen.artifact is not None:
        out["artifact"] = seen.artifact.summary
    # Advertised only while something serves it (None: the merge patch removes it).
    out["endpoint"] = None if owner.spec.decode.replicas == 0 else endpoint(owner)
    out["selector"] = selector_string(owner, "decode")
    return out


def summary(ready: int, desired: int) -> str:
    """A role's ``status.<role>.summary``, "ready/desired" (kubectl get shows it)."""
    return f"{ready}/{desired}"


def desired_of(summary_: str | None) -> int | None:
    """The desired count a role's summary carries (None: no summary written yet, or not one of ours)."""
    _, _, desired = (summary_ or "").partition("/")
    return int(desired) if desired.isdigit() else None


def rollout_conditions(owner: Owner, seen: Observation, profile: NpuProfile) -> list[Condition]:
    """Ready, Progressing and Degraded."""
    done = [f"{s.role} {s.desired}/{s.desired} ready" for s in seen.roles if s.rolled_out()]
    progress = [s.progress() for s in seen.roles if not s.rolled_out()]
    degraded = [m for s in seen.roles for m in s.failures(owner, profile)]
    if seen.artifact is not None and seen.artifact.summary in ("Failed", "Mismatch"):
        degraded.append(seen.artifact.message)
    # No decode pod: nothing answers a client, however complete the rollout (0/0) is.
    scaled_to_zero = owner.spec.decode.replicas == 0
    if not progress and not scaled_to_zero:
        ready = Condition("Ready", True, "AllReplicasReady", ", ".join(done))
    elif scaled_to_zero:
        ready = Condition("Ready", False, "ScaledToZero", "decode.replicas is 0: no pod serves the endpoint")
    else:
        ready = Condition("Ready", False, "ReplicasNotReady", "; ".join(progress))
    if progress:
        progressing = Condition("Progressing", True, "RollingOut", "; ".join(progress))
    else:
        progressing = Condition("Progressing", False, "RolloutComplete", "every role runs the current spec")
    if not degraded:
        trouble = Condition("Degraded", False, "AsExpected", "no pod is stuck")
    else:
        short = any("insufficient" in d for d in degraded)
        trouble = Condition("Degraded", True, "InsufficientNPUs" if short else "PodsCannotRun", "; ".join(degraded))
    return [ready, progressing, trouble]


def artifact_condition(artifact: Report | None) -> Condition | None:
    if artifact is None:
        return None
    return Condition("ArtifactReady", artifact.ready, artifact.reason, artifact.message)
