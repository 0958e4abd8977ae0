"""The AtomDeployment API (serving.atom.dev/v1alpha1) as pydantic models. Torch-free: the operator imports it.

The models are the spec: the CRD in ``crds/`` is generated from them (``python -m atom_engine.api.crd``), the
admission webhook validates with them, and the engine's settings are rendered from them (:func:`engine_settings`).
"""

from atom_engine.api.npu import NpuProfile, npu_demand
from atom_engine.api.resource import GROUP, KIND, PLURAL, SHORT_NAME, VERSION, AtomDeployment, Problem, problems
from atom_engine.api.spec import (
    AtomDeploymentSpec,
    DecodeSpec,
    ModelSpec,
    PrefillSpec,
    ServiceSpec,
    engine_settings,
)
from atom_engine.api.status import AtomDeploymentStatus, Condition, RoleStatus

__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAME",
    "VERSION",
    "AtomDeployment",
    "AtomDeploymentSpec",
    "AtomDeploymentStatus",
    "Condition",
    "DecodeSpec",
    "ModelSpec",
    "NpuProfile",
    "PrefillSpec",
    "Problem",
    "RoleStatus",
    "ServiceSpec",
    "engine_settings",
    "npu_demand",
    "problems",
]
