"""Pure functions from an AtomDeployment to the child objects it should have (no API server involved)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from atom_operator.children.configmap import build_configmap
from atom_operator.children.meta import (
    APPLIED_HASH,
    Defaults,
    Owner,
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


def build_children(owner: Owner, defaults: Defaults) -> Children:
    roles = ["decode"] + (["prefill"] if owner.spec.prefill.replicas > 0 else [])
    desired: list[dict[str, Any]] = []
    configs = {role: build_configmap(owner, role) for role in roles}
    desired.extend(configs.values())
    desired.append(build_service(owner))
    if "prefill" in roles:
        desired.append(build_prefill_service(owner))
        desired.append(build_deployment(owner, "prefill", digest(configs["prefill"]["data"]), defaults))
    desired.append(build_deployment(owner, "decode", digest(configs["decode"]["data"]), defaults))
    if defaults.network_policy:
        desired.extend(build_network_policy(owner, role) for role in roles)
    for child in desired:
        child["metadata"]["annotations"] = {APPLIED_HASH: digest(child)}
    absent = (
        []
        if "prefill" in roles
        else [
            ("Deployment", workload_name(owner, "prefill")),
            ("Service", prefill_service_name(owner)),
            ("ConfigMap", config_name(owner, "prefill")),
            *([("NetworkPolicy", prefill_service_name(owner))] if defaults.network_policy else []),
        ]
    )
    return Children(desired, absent)
