"""Names, labels and the owner reference every child of an AtomDeployment carries."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from atom_operator.api import GROUP, KIND, VERSION, AtomDeploymentSpec
from atom_operator.api.rules import CHILD_NAME_SUFFIXES
from atom_operator.npu import NpuProfile

WorkloadRole = Literal["decode", "prefill"]
ROLES: tuple[WorkloadRole, ...] = ("decode", "prefill")

APP_NAME = "atom-engine"
DEPLOYMENT_LABEL = f"{GROUP}/deployment"
# The hash of what the operator last applied to a child: a spec change that only removes a field still shows.
APPLIED_HASH = f"{GROUP}/applied-hash"
# The hash of a role's ConfigMap on its pod template: a settings change rolls the pods.
CONFIG_HASH = f"{GROUP}/config-hash"
# On a compile Job: which artifact it builds (the role's settings and image); a new one replaces the Job.
ARTIFACT_KEY = f"{GROUP}/artifact-key"
MANAGER = "atom-operator"

# The suffixes are defined with the name-length limit (atom_operator.api.rules); unpack them so a new child
# kind cannot be named here without the limit knowing about it.
_SERVICE, _DECODE, _PREFILL, _DECODE_CONFIG, _PREFILL_CONFIG, _DECODE_BUILD, _PREFILL_BUILD, EPP_SUFFIX = (
    CHILD_NAME_SUFFIXES
)


@dataclass(frozen=True)
class Owner:
    """The AtomDeployment the children are built from: its identity and its validated spec."""

    name: str
    namespace: str
    uid: str
    spec: AtomDeploymentSpec


@dataclass(frozen=True)
class Defaults:
    """The operator's configuration for what the spec leaves open."""

    image: str = "ghcr.io/atom-dev/atom-engine:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    rngd_image: str = "ghcr.io/atom-dev/atom-engine-rngd:0.1.0"  # Dockerfile target engine-rngd (furiosa-torch)
    npu: NpuProfile = field(default_factory=NpuProfile)  # this cluster's NPU resource names and node labels
    network_policy: bool = False  # give every AtomDeployment its NetworkPolicies (children/networkpolicy.py)
    # spec.routing.inferencePool's endpoint picker: GIE's cmd/epp at the version hack/tools/epp pins
    epp_image: str = "ghcr.io/atom-dev/atom-epp:v1.5.0"


def service_name(owner: Owner) -> str:
    return owner.name + _SERVICE


def workload_name(owner: Owner, role: WorkloadRole) -> str:
    return owner.name + (_DECODE if role == "decode" else _PREFILL)


def prefill_service_name(owner: Owner) -> str:
    # The headless Service shares the prefill Deployment's name: different kinds, one name per role.
    return owner.name + _PREFILL


def build_name(owner: Owner, role: WorkloadRole) -> str:
    """The role's compile Job: one per AtomDeployment and role, replaced when the artifact it builds changes."""
    return owner.name + (_DECODE_BUILD if role == "decode" else _PREFILL_BUILD)


def config_name(owner: Owner, role: WorkloadRole) -> str:
    return owner.name + (_DECODE_CONFIG if role == "decode" else _PREFILL_CONFIG)


def selector_labels(owner: Owner, role: WorkloadRole) -> dict[str, str]:
    """The labels a role's pods are selected by (immutable in a Deployment, so nothing that can change)."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": role,
    }


# With spec.autoscaling, pods carry this label ("true" from their template) and the Services and the InferencePool
# select it too, so the autoscaler takes a pod out of traffic (cordons it) by setting it "false" while the
# Deployment, whose selector never has it, keeps the pod. (atom_operator.autoscale.drain)
ACCEPTING = f"{GROUP}/accepting"


def traffic_selector(owner: Owner, role: WorkloadRole) -> dict[str, str]:
    """What the Services and the InferencePool select: the role's pods, and with autoscaling those accepting."""
    out = selector_labels(owner, role)
    if owner.spec.autoscaling is not None:
        out[ACCEPTING] = "true"
    return out


def labels(owner: Owner, role: WorkloadRole | None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/managed-by": MANAGER,
        DEPLOYMENT_LABEL: owner.name,
    }
    if role is not None:
        out["app.kubernetes.io/component"] = role
    return out


def selector_string(owner: Owner, role: WorkloadRole) -> str:
    """The label selector of a role's pods as a string (status.selector, for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(owner, role).items()))


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        # Foreground deletion of the AtomDeployment waits for its children.
        "blockOwnerDeletion": True,
    }


def metadata(owner: Owner, name: str, role: WorkloadRole | None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, role),
        "ownerReferences": [owner_reference(owner)],
    }


def digest(value: Any) -> str:
    """A short stable hash of a JSON-like value."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
