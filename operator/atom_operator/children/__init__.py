"""Pure functions from an AtomDeployment to the child objects it should have (no API server involved)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from atom_operator.api.spec import prefill_role
from atom_operator.children.compile import artifact_key, build_job
from atom_operator.children.configmap import build_configmap
from atom_operator.children.inferencepool import build_epp, build_http_route, build_inference_pool, epp_name
from atom_operator.children.meta import (
    APPLIED_HASH,
    Defaults,
    Owner,
    WorkloadRole,
    build_name,
    config_name,
    digest,
    prefill_service_name,
    workload_name,
)
from atom_operator.children.networkpolicy import build_network_policy
from atom_operator.children.service import build_prefill_service, build_service, endpoint
from atom_operator.children.workload import build_deployment

__all__ = ["Children", "Defaults", "Owner", "build_children", "endpoint"]


@dataclass(frozen=True)
class Children:
    """What should exist (in apply order: settings before the pods that read them) and what should not."""

    desired: list[dict[str, Any]]
    absent: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)
    withheld: list[tuple[str, str]] = field(default_factory=list)  # (kind, name): left as they are for now


def build_children(
    owner: Owner,
    defaults: Defaults,
    built: Collection[str] = (),
    served: Collection[str] = (),
    routed_before: bool = False,
) -> Children:
    """``built``: the artifact keys whose compile Job succeeded (only read with spec.model.compileCache);
    ``served``: which of the optional kinds (InferencePool, HTTPRoute) the cluster has CRDs for;
    ``routed_before``: whether routing children may exist from an earlier reconcile (then those no longer wanted
    are removed)."""
    roles: list[WorkloadRole] = ["decode"] + (["prefill"] if prefill_role(owner.spec) else [])
    desired: list[dict[str, Any]] = []
    configs = {role: build_configmap(owner, role, defaults) for role in roles}
    desired.extend(configs.values())
    desired.append(build_service(owner))
    if "prefill" in roles:
        desired.append(build_prefill_service(owner))
    withheld: list[tuple[str, str]] = []
    for role in reversed(roles):  # prefill first: decode pods call the workers
        deployment = build_deployment(owner, role, digest(configs[role]["data"]), defaults)
        if owner.spec.model.compile_cache:
            template = deployment["spec"]["template"]
            key = artifact_key(configs[role]["data"], template["spec"]["containers"][0]["image"])
            desired.append(build_job(owner, role, template, key))
            if key not in built:
                # No pod before its artifact: a new role waits; a running one keeps its pods (and their artifact)
                # until the new artifact is built.
                withheld.append(("Deployment", deployment["metadata"]["name"]))
                continue
        desired.append(deployment)
    if defaults.network_policy:
        desired.extend(build_network_policy(owner, role) for role in roles)
    routed = routing_children(owner, defaults, served)
    desired.extend(routed)
    for child in desired:
        applied = digest(child)
        child["metadata"].setdefault("annotations", {})[APPLIED_HASH] = applied
    absent = [("Job", build_name(owner, r)) for r in roles if not owner.spec.model.compile_cache]
    if "prefill" not in roles:
        absent += [
            ("Deployment", workload_name(owner, "prefill")),
            ("Service", prefill_service_name(owner)),
            ("ConfigMap", config_name(owner, "prefill")),
            *([("NetworkPolicy", prefill_service_name(owner))] if defaults.network_policy else []),
            ("Job", build_name(owner, "prefill")),
        ]
    if routed_before:
        wanted = {(c["kind"], c["metadata"]["name"]) for c in routed}
        absent += [ref for ref in routing_refs(owner) if ref not in wanted]
    return Children(desired, absent, withheld)


def routing_refs(owner: Owner) -> list[tuple[str, str]]:
    """Every child spec.routing.inferencePool can make: the pool, the picker's five objects, the route."""
    epp = epp_name(owner)
    return [("InferencePool", owner.name), ("HTTPRoute", owner.name),
            *((kind, epp) for kind in ("Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"))]


def routing_children(owner: Owner, defaults: Defaults, served: Collection[str]) -> list[dict[str, Any]]:
    """spec.routing.inferencePool: the pool and its picker, and a route for a named Gateway, where served."""
    pool = owner.spec.routing.inference_pool
    if not pool.enabled or "InferencePool" not in served:
        return []
    out = [build_inference_pool(owner), *build_epp(owner, defaults.epp_image, defaults.image_pull_policy)]
    if pool.gateway is not None and "HTTPRoute" in served:
        out.append(build_http_route(owner, pool.gateway.name, pool.gateway.namespace))
    return out
