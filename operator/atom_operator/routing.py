"""spec.routing.inferencePool against what the cluster serves: which optional CRDs are installed, and the
``InferencePool`` condition that says what was made, or why not.

The extension's and the Gateway API's CRDs are optional: a cluster without them gets a condition naming the
missing CRD (the Service keeps serving), never a failed reconcile. Whether they are installed is asked of the API
server's discovery at most every ``TTL`` seconds per operator, and only for AtomDeployments that enable routing.
A CRD's arrival is no event the operator watches: while an AtomDeployment's condition says ``CRDNotInstalled`` it
is reconciled again every ``TTL`` seconds (:func:`waits_for_crd`), so the pool follows within about that.
Each controller owns one :class:`Discovery` and hands it to its reconciles.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from atom_operator.children.inferencepool import epp_name
from atom_operator.children.meta import Owner
from atom_operator.kube import Kube
from atom_operator.status import Condition

OPTIONAL_KINDS = {
    "InferencePool": "inferencepools.inference.networking.k8s.io (the Gateway API Inference Extension's CRDs)",
    "HTTPRoute": "httproutes.gateway.networking.k8s.io (the Gateway API's CRDs)",
}
CONDITION = "InferencePool"
CRD_NOT_INSTALLED, POOL_CREATED = "CRDNotInstalled", "PoolCreated"
TTL = 15.0  # a CRD installed after the AtomDeployment asked for routing is picked up within about this


@dataclass
class Discovery:
    """The optional kinds the API server served when last asked (at most every ``TTL`` seconds)."""

    kube: Kube
    served: frozenset[str] = frozenset()
    asked_at: float = field(default=float("-inf"))

    async def kinds(self) -> frozenset[str]:
        if time.monotonic() - self.asked_at >= TTL:
            self.served = frozenset([k for k in OPTIONAL_KINDS if await self.kube.serves(k)])
            self.asked_at = time.monotonic()
        return self.served


def reported(body: dict[str, Any]) -> dict[str, Any] | None:
    """The ``InferencePool`` condition the status has, whatever the spec says now (routing may just be off)."""
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION), None)


def waits_for_crd(verdict: Condition | None) -> bool:
    """Whether the condition waits for a CRD to be installed: the AtomDeployment is to be looked at again."""
    return verdict is not None and verdict.reason == CRD_NOT_INSTALLED


def condition(owner: Owner, served: Collection[str]) -> Condition | None:
    """The ``InferencePool`` condition; None when routing is off."""
    pool = owner.spec.routing.inference_pool
    if not pool.enabled:
        return None
    if "InferencePool" not in served:
        return Condition(CONDITION, False, CRD_NOT_INSTALLED,
                         f"no InferencePool: the cluster lacks {OPTIONAL_KINDS['InferencePool']}; install them to"
                         f" route by prefix. Requests reach the decode pods through the Service {owner.name}"
                         " meanwhile")
    message = f"InferencePool {owner.name} of the decode pods, picked by {epp_name(owner)}"
    if pool.gateway is None:
        return Condition(CONDITION, True, POOL_CREATED, message)
    if "HTTPRoute" not in served:
        return Condition(CONDITION, False, CRD_NOT_INSTALLED,
                         f"{message}; no HTTPRoute to Gateway {pool.gateway.name}: the cluster lacks"
                         f" {OPTIONAL_KINDS['HTTPRoute']}")
    return Condition(CONDITION, True, POOL_CREATED,
                     f"{message}, routed from Gateway {pool.gateway.name} by HTTPRoute {owner.name}")
