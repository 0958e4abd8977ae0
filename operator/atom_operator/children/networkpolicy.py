"""NetworkPolicies of one AtomDeployment (operator setting ATOM_NETWORK_POLICY, chart value networkPolicy.enabled).

Clients reach the decode pods' HTTP port (the OpenAI endpoint); only this AtomDeployment's decode pods reach its
prefill pods' HTTP and KV ports (the KV they ship back is the prompt's); the metrics port of both stays open to
scrapers.
Every other port of the engine pods is closed. Egress is not restricted.
"""

from __future__ import annotations

from typing import Any

from atom_operator.children.configmap import HTTP_PORT, KV_PORT
from atom_operator.children.meta import (
    Owner,
    WorkloadRole,
    metadata,
    prefill_service_name,
    selector_labels,
    service_name,
)
from atom_operator.children.workload import METRICS_PORT


def _port(port: int) -> dict[str, Any]:
    return {"port": port, "protocol": "TCP"}


def build_network_policy(owner: Owner, role: WorkloadRole) -> dict[str, Any]:
    http: dict[str, Any] = {"ports": [_port(HTTP_PORT)]}
    if role == "prefill":
        http = {"ports": [_port(HTTP_PORT), _port(KV_PORT)],
                "from": [{"podSelector": {"matchLabels": selector_labels(owner, "decode")}}]}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        # Named as the role's Service: one name per role, different kinds.
        "metadata": metadata(owner, service_name(owner) if role == "decode" else prefill_service_name(owner), role),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner, role)},
            "policyTypes": ["Ingress"],
            "ingress": [http, {"ports": [_port(METRICS_PORT)]}],
        },
    }
