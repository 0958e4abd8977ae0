"""Admission review of AtomDeployments: pure functions, no Kubernetes client.

The refusals are exactly what the CRD's schema and CEL rules refuse (the same models and
:mod:`atom_operator.api.rules`: the engine's limits and the cluster's rules), so the webhook never contradicts the
API server. On top, it warns about what CEL cannot see: NPUs the cluster does not have, a model volume whose claim
does not exist.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from atom_operator.api import AtomDeploymentSpec, problems
from atom_operator.api.fields import depth
from atom_operator.npu import DEFAULT_PROFILE, NpuProfile, fusion_refusals, npu_demand, vendor_resources

# Deeper than any valid object (free-form fields stop at 32 levels below their field), shallow enough that
# nothing downstream (pydantic) gets near Python's recursion limit.
MAX_OBJECT_DEPTH = 64


@dataclass(frozen=True)
class Verdict:
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.refusals


def review(
    obj: Any,
    *,
    old: Any = None,
    allocatable: Mapping[str, int] | None = None,
    claims: Collection[str] | None = None,
    profile: NpuProfile = DEFAULT_PROFILE,
) -> Verdict:
    """Review a CREATE (``old`` None) or UPDATE of ``obj``, both dicts as the API server sends them.

    ``allocatable`` maps the vendors' NPU resources to the cluster's total allocatable (None: unknown, no warning);
    ``profile`` names the resources this cluster's pods request;
    ``claims`` holds the PersistentVolumeClaim names of the object's namespace (None: unknown).
    """
    if not isinstance(obj, Mapping):
        return Verdict([f"object: must be a JSON object; got {type(obj).__name__}"])
    if depth(obj) > MAX_OBJECT_DEPTH:
        return Verdict([f"object: must be nested at most {MAX_OBJECT_DEPTH} levels deep"])
    found = problems(obj)
    if found:
        return Verdict([str(p) for p in found])
    # A metadata or status change is an UPDATE too; only a spec change deserves new warnings.
    if isinstance(old, Mapping) and old.get("spec") == obj.get("spec"):
        return Verdict()
    spec = AtomDeploymentSpec.model_validate(obj["spec"])
    refusals = fusion_refusals(spec, profile)  # needs this cluster's resource names, which the CRD's rules lack
    if refusals:
        return Verdict(refusals)
    return Verdict(warnings=[*npu_warnings(spec, allocatable, profile), *volume_warnings(spec, obj, claims)])


def npu_warnings(
    spec: AtomDeploymentSpec, allocatable: Mapping[str, int] | None, profile: NpuProfile = DEFAULT_PROFILE
) -> list[str]:
    if allocatable is None:
        return []
    out = []
    for resource, need in npu_demand(spec, profile).items():
        have = allocatable.get(resource, 0)
        if need > have:
            roles = ", ".join(
                f"{name} {r.replicas} × {r.npus_per_replica}"
                for name, r in (("decode", spec.decode), ("prefill", spec.prefill))
                if profile.resource(r.backend) == resource and r.replicas
            )
            out.append(
                f"needs {need} {resource}, cluster has {have} allocatable ({roles}); pods that do not fit stay Pending"
                + _other_names(resource, allocatable)
            )
    return out


def _other_names(resource: str, allocatable: Mapping[str, int]) -> str:
    """The same vendor's NPUs advertised under other names: most likely the profile names the wrong scheme."""
    domain = resource.split("/", 1)[0]
    others = {r: n for r, n in allocatable.items() if r != resource and r.split("/", 1)[0] == domain and n > 0}
    if not others:
        return ""
    listed = ", ".join(f"{r}: {n}" for r, n in sorted(others.items()))
    return (
        f"; the nodes advertise {listed}: if those are the NPUs meant, set the operator's NPU profile to that"
        " name (chart value npu.<backend>.resource)"
    )


def volume_warnings(spec: AtomDeploymentSpec, obj: Mapping[str, Any], claims: Collection[str] | None) -> list[str]:
    volume = spec.model.volume or {}
    pvc = volume.get("persistentVolumeClaim")
    claim = pvc.get("claimName") if isinstance(pvc, Mapping) else None
    if claims is None or not isinstance(claim, str) or claim in claims:
        return []
    namespace = obj.get("metadata", {}).get("namespace") or "default"
    return [
        f"spec.model.volume.persistentVolumeClaim.claimName: PersistentVolumeClaim '{claim}' does not exist in"
        f" namespace '{namespace}'; pods stay Pending until it does"
    ]


def node_npus(allocatable: Mapping[str, Any]) -> dict[str, int]:
    """The NPU resources of one node's ``status.allocatable``: every name under the vendors' domains, so the
    warning can tell a profile naming one scheme from nodes advertising another."""
    return vendor_resources(allocatable)


def total(per_node: Iterable[Mapping[str, int]]) -> dict[str, int]:
    sums: dict[str, int] = {}
    for npus in per_node:
        for resource, count in npus.items():
            sums[resource] = sums.get(resource, 0) + count
    return sums
