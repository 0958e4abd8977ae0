"""The decode pods as a Gateway API Inference Extension ``InferencePool`` (spec.routing.inferencePool).

A gateway that supports the extension (Envoy Gateway, kgateway, Istio, GKE, or Envoy with an ext_proc filter)
sends each request of the pool to the pod its endpoint picker (EPP) chooses; the EPP watches the pool's pods and
scrapes their vLLM metrics (queue, KV usage, ``vllm:cache_config_info``) and routes by prompt prefix, so a prefix
stays on the replica whose cache holds it. The plain Service stays as the path for everything else.
"""

from __future__ import annotations

from typing import Any

from atom_operator.children.configmap import HTTP_PORT
from atom_operator.children.meta import EPP_SUFFIX, Owner, metadata, traffic_selector

POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_PLURAL = "inferencepools"
# The picker image's non-root user (the Dockerfile's epp stage: upstream's distroless "nonroot" uid).
EPP_UID = 65532
EPP_GRPC_PORT = 9002  # the port GIE's gateways and charts expect the picker's ext_proc service on


def epp_name(owner: Owner) -> str:
    return owner.name + EPP_SUFFIX


def build_inference_pool(owner: Owner) -> dict[str, Any]:
    """The pool: the decode pods' labels and port, picked by ``<name>-epp``; FailOpen, so a picker outage
    degrades to the gateway's own balancing instead of failing the requests."""
    return {
        "apiVersion": f"{POOL_GROUP}/{POOL_VERSION}",
        "kind": "InferencePool",
        "metadata": metadata(owner, owner.name, "decode"),
        "spec": {
            "selector": {"matchLabels": traffic_selector(owner, "decode")},
            "targetPorts": [{"number": HTTP_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": epp_name(owner),
                "port": {"number": EPP_GRPC_PORT},
                "failureMode": "FailOpen",
            },
        },
    }


# What the picker reads: its pool, the pool's pods, and the extension's optional objectives and rewrites (v1.5.0
# watches them; without their CRDs it runs without). Nothing cluster-wide: metrics auth is off (no TokenReviews).
EPP_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [POOL_GROUP], "resources": [POOL_PLURAL], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives", "inferencemodelrewrites"],
     "verbs": ["get", "list", "watch"]},
]
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090


def build_epp(owner: Owner, image: str, pull_policy: str) -> list[dict[str, Any]]:
    """The pool's endpoint picker: ServiceAccount, Role and RoleBinding (read-only, this namespace), Deployment
    and Service ``<name>-epp``. TLS on its ext_proc port (a self-signed certificate, what the extension's gateways
    expect); its own metrics without auth, like the engines'."""
    name = epp_name(owner)
    meta = metadata(owner, name, None)
    selector = {"app.kubernetes.io/name": "atom-epp", "app.kubernetes.io/instance": owner.name}
    grpc = {"name": "grpc-ext-proc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"}
    probe = {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}, "periodSeconds": 10}
    container = {
        "name": "epp",
        "image": image,
        "imagePullPolicy": pull_policy,
        "args": ["--pool-name", owner.name, "--pool-namespace", owner.namespace,
                 "--grpc-port", str(EPP_GRPC_PORT), "--grpc-health-port", str(EPP_HEALTH_PORT),
                 "--metrics-port", str(EPP_METRICS_PORT), "--metrics-endpoint-auth=false", "--tracing=false",
                 "--enable-pprof=false"],
        "ports": [grpc, {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": EPP_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": {**meta["labels"], **selector}}, "spec": {
                "serviceAccountName": name,
                "containers": [container],
                "securityContext": {"runAsNonRoot": True, "runAsUser": EPP_UID, "runAsGroup": EPP_UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
            }},
        }},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
            "selector": selector,
            "ports": [{"name": "grpc-ext-proc", "port": EPP_GRPC_PORT, "targetPort": EPP_GRPC_PORT,
                       "protocol": "TCP", "appProtocol": "http2"},
                      {"name": "metrics", "port": EPP_METRICS_PORT, "targetPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        }},
    ]


def build_http_route(owner: Owner, gateway: str, gateway_namespace: str | None) -> dict[str, Any]:
    """Every path of the named Gateway to the pool (the Gateway's controller then asks the picker)."""
    parent: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway}
    if gateway_namespace:
        parent["namespace"] = gateway_namespace
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata(owner, owner.name, None),
        "spec": {
            "parentRefs": [parent],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                       "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool", "name": owner.name}]}],
        },
    }
