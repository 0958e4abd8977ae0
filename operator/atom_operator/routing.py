"""spec.routing.inferencePool against what the cluster serves: which optional CRDs are installed, and the
``InferencePool`` condition that says what was made, or why not.

The extension's and the Gateway API's CRDs are optional: a cluster without them gets a condition naming the
missing CRD (the Service keeps serving), never a failed reconcile. Whether they are installed is asked of the API
server's discovery at most every ``TTL`` seconds per operator, and only for AtomDeployments that enable routing.
A CRD's arrival is no event the operator watches: while an AtomDeployment's condition says ``CRDNotInstalled`` it
is reconciled again every ``TTL`` seconds (:func:`waits_for_crd`), so the pool follows within about that.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

from atom_operator.children.inferencepool import epp_name
from atom_operator.children.meta import Owner
from atom_operator.kube import Kube

OPTIONAL_KINDS = {
    "InferencePool": "inferencepools.inference.networking.k8s.io (the Gateway API Inference Extension's CRDs)",
    "HTTPRoute": "httproutes.gateway.networking.k8s.io (the Gateway API's CRDs)",
}
TTL = 15.0  # a CRD installed after the AtomDeployment asked for routing is picked up within about this


@dataclass
class Discovery:
    """The optional kinds the API server served when last asked."""

    served: frozenset[str] = frozenset()
    asked_at: float = field(default=float("-inf"))

    async def kinds(self, kube: Kube) -> frozenset[str]:
        if time.monotonic() - self.asked_at >= TTL:
            self.served = frozenset([k for k in OPTIONAL_KINDS if await kube.serves(k)])
            self.asked_at = time.monotonic()
        return self.served


DISCOVERY = Discovery()


def reported(body: dict) -> dict | None:
    """The ``InferencePool`` condition the status has, whatever the spec says now (routing may just be off)."""
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "InferencePool"),
                None)


def previous(owner: Owner, body: dict) -> tuple[bool, str, str] | None:
    """The ``InferencePool`` condition as the status has it (None when routing is off or none was reported)."""
    c = reported(body)
    if not owner.spec.routing.inference_pool.enabled or c is None:
        return None
    return c.get("status") == "True", c.get("reason", ""), c.get("message", "")


def waits_for_crd(verdict: tuple[bool, str, str] | None) -> bool:
    """Whether the condition waits for a CRD to be installed: the AtomDeployment is to be looked at again."""
    return verdict is not None and verdict[1] == "CRDNotInstalled"


def condition(owner: Owner, served: Collection[str]) -> tuple[bool, str, str] | None:
    """(status, reason, message) of the ``InferencePool`` condition; None when routing is off."""
    pool = owner.spec.routing.inference_pool
    if not pool.enabled:
        return None
    if "InferencePool" not in served:
        return (False, "CRDNotInstalled",
                f"no InferencePool: the cluster lacks {OPTIONAL_KINDS['InferencePool']}; install them to route by"
                f" prefix. Requests reach the decode pods through the Service {owner.name} meanwhile")
    message = f"InferencePool {owner.name} of the decode pods, picked by {epp_name(owner)}"
    if pool.gateway is None:
        return True, "PoolCreated", message
    if "HTTPRoute" not in served:
        return (False, "CRDNotInstalled",
                f"{message}; no HTTPRoute to Gateway {pool.gateway.name}: the cluster lacks"
                f" {OPTIONAL_KINDS['HTTPRoute']}")
    return True, "PoolCreated", f"{message}, routed from Gateway {pool.gateway.name} by HTTPRoute {owner.name}"
