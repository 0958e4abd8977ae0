"""The AtomDeployment API (serving.atom.dev/v1alpha1): the spec and status models, and the CRD made from them.

The models are the spec: the CRD in ``crds/`` is generated from them (``python -m atom_operator.api.crd``), the
admission webhook validates with them, and the engine's settings are rendered from them (:func:`engine_settings`).
"""

from atom_operator.api.resource import GROUP, KIND, PLURAL, SHORT_NAME, VERSION, AtomDeployment, Problem, problems
from atom_operator.api.spec import (
    AtomDeploymentSpec,
    DecodeSpec,
    ModelSpec,
    PrefillSpec,
    ServiceSpec,
    engine_settings,
)
from atom_operator.api.status import AtomDeploymentStatus, Condition, RoleStatus

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
    "PrefillSpec",
    "Problem",
    "RoleStatus",
    "ServiceSpec",
    "engine_settings",
    "problems",
]
