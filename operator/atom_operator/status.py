"""``AtomDeployment.status`` from what the watches saw of the child Deployments and pods (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from atom_operator.artifacts import Report, failure_of
from atom_operator.children import Owner, endpoint
from atom_operator.children.meta import APPLIED_HASH, ROLES, Role, selector_string
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
    owner: Owner, role: Role, pods: list[PodView], profile: NpuProfile = DEFAULT_PROFILE
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


def _condition(
    type_: str, ok: bool, reason: str, message: str, generation: int, old: dict[str, dict[str, Any]], now: str
) -> dict[str, Any]:
    status = "True" if ok else "False"
    previous = old.get(type_)
    # The transition time moves only when the status does, as metav1.Condition requires.
    since = previous["lastTransitionTime"] if previous and previous.get("status") == status else now
    return {
        "type": type_,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": since,
        "reason": reason,
        "message": message,
    }


def compute(
    owner: Owner,
    generation: int,
    deployments: dict[Role, dict[str, Any] | None],
    applied_hashes: dict[Role, str],
    pods: list[PodView],
    old: dict[str, Any] | None,
    now: str,
    profile: NpuProfile = DEFAULT_PROFILE,
    artifact: Report | None = None,
    routing: tuple[bool, str, str] | None = None,
) -> dict[str, Any]:
    """The whole status; ``old`` keeps conditions' transition times, ``now`` stamps new transitions;
    ``artifact``: the compile Jobs' report (spec.model.compileCache only); ``routing``: the InferencePool
    condition (spec.routing.inferencePool only)."""
    roles: list[Role] = [r for r in ROLES if r == "decode" or owner.spec.prefill.replicas > 0]
    out: dict[str, Any] = {"observedGeneration": generation}
    done, progress, degraded = [], [], []
    for role in ROLES:
        desired = (owner.spec.decode if role == "decode" else owner.spec.prefill).replicas
        counts = role_counts(deployments.get(role)) if role in roles else role_counts(None)
        out[role] = {**counts, "summary": f"{counts['readyReplicas']}/{desired}"}
        if role not in roles:
            continue
        if rolled_out(deployments.get(role), desired, applied_hashes[role]):
            done.append(f"{role} {desired}/{desired} ready")
        else:
            progress.append(
                f"{role}: {counts['updatedReplicas']} of {desired} pods updated, {counts['readyReplicas']} ready"
            )
        message = pending_message(owner, role, pods, profile)
        if message:
            degraded.append(message)
        for c in (deployments.get(role) or {}).get("status", {}).get("conditions") or []:
            if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
                degraded.append(f"{role}: {c.get('message') or c.get('reason')}")
    if artifact is not None and artifact.summary in ("Failed", "Mismatch"):
        degraded.append(artifact.message)
    previous = {c["type"]: c for c in (old or {}).get("conditions") or [] if "type" in c}
    # No decode pod: nothing answers a client, however complete the rollout (0/0) is.
    scaled_to_zero = owner.spec.decode.replicas == 0
    ready = not progress and not scaled_to_zero
    if ready:
        reason, message = "AllReplicasReady", ", ".join(done)
    elif scaled_to_zero:
        reason, message = "ScaledToZero", "decode.replicas is 0: no pod serves the endpoint"
    else:
        reason, message = "ReplicasNotReady", "; ".join(progress)
    out["conditions"] = [
        _condition("Ready", ready, reason, message, generation, previous, now),
        _condition(
            "Progressing",
            bool(progress),
            "RollingOut" if progress else "RolloutComplete",
            "; ".join(progress) or "every role runs the current spec",
            generation,
            previous,
            now,
        ),
        _condition(
            "Degraded",
            bool(degraded),
            ("InsufficientNPUs" if any("insufficient" in d for d in degraded) else "PodsCannotRun")
            if degraded
            else "AsExpected",
            "; ".join(degraded) or "no pod is stuck",
            generation,
            previous,
            now,
        ),
    ]
    if artifact is not None:
        out["conditions"].append(
            _condition("ArtifactReady", artifact.ready, artifact.reason, artifact.message, generation, previous, now)
        )
        out["artifact"] = artifact.summary
    if routing is not None:
        out["conditions"].append(_condition("InferencePool", *routing, generation, previous, now))
    # Advertised only while something serves it (None: the merge patch removes it).
    out["endpoint"] = None if scaled_to_zero else endpoint(owner)
    out["selector"] = selector_string(owner, "decode")
    return out
