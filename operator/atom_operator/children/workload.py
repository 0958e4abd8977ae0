"""The Deployment of one role: engine pods on the role's NPU nodes, hardened to the restricted Pod Security profile."""

from __future__ import annotations

import math
from typing import Any

from atom_engine.cpu_allowance import CPU_LIMIT_ENV, CPU_REQUEST_ENV
from atom_engine.settings import EngineSettings

from atom_operator import sizing
from atom_operator.api.spec import COMPILE_CACHE_PATH
from atom_operator.children.configmap import CONFIG_DIR, CONFIG_PATH, HTTP_PORT, KV_PORT
from atom_operator.children.meta import (
    CONFIG_HASH,
    Defaults,
    Owner,
    WorkloadRole,
    config_name,
    labels,
    metadata,
    selector_labels,
    traffic_selector,
    workload_name,
)
from atom_operator.npu import npus_requested

METRICS_PORT = 9090
# Covers the engine's whole shutdown (its drain, then in-flight requests up to their limit) with room to spare,
# so the kubelet's SIGKILL never cuts a request that the engine would have finished.
TERMINATION_GRACE_SECONDS = (
    math.ceil(
        EngineSettings.model_fields["drain_seconds"].default + EngineSettings.model_fields["finish_seconds"].default
    )
    + 10
)
SCRATCH_DIR = "/tmp"
# The engine images' own non-root user (the Dockerfile's `useradd --uid 10001` in engine and engine-rngd).
ENGINE_UID = 10001


def engine_command(role: WorkloadRole) -> list[str]:
    """The engine CLI every pod runs; the only place the operator spells it."""
    return [
        "atom-engine",
        "serve",
        "--role",
        role,
        "--config",
        CONFIG_PATH,
        "--port",
        str(HTTP_PORT),
        "--metrics-port",
        str(METRICS_PORT),
    ]


def _resources(owner: Owner, role: WorkloadRole, defaults: Defaults) -> dict[str, Any]:
    spec = owner.spec.decode if role == "decode" else owner.spec.prefill
    user = spec.resources
    # Quantities as strings: the API server stores them so, and the applier compares what it reads back.
    out = {
        kind: {k: str(v) for k, v in (getattr(user, kind) or {}).items()}
        for kind in ("limits", "requests")
        if user is not None and getattr(user, kind)
    }
    # CPU and memory the user leaves out get defaults sized from the model (never BestEffort).
    out = sizing.with_defaults(out, sizing.default_resources(owner.spec, role))
    npu, npus = defaults.npu.resource(spec.backend), npus_requested(spec, defaults.npu)
    if npu and npus:
        # Extended resources are requested through limits (requests default to them and may not differ).
        out.setdefault("limits", {})[npu] = str(npus)
        out.get("requests", {}).pop(npu, None)
    return out


def engine_image(owner: Owner, role: WorkloadRole, defaults: Defaults) -> str:
    """The role's own image, else spec.image, else the operator's; rngd pods need furiosa-torch's own image."""
    spec = owner.spec.decode if role == "decode" else owner.spec.prefill
    if spec.image:
        return spec.image
    if spec.backend == "rngd":
        return defaults.rngd_image
    return owner.spec.image or defaults.image


def _container(owner: Owner, role: WorkloadRole, defaults: Defaults) -> dict[str, Any]:
    spec = owner.spec
    backend = (spec.decode if role == "decode" else spec.prefill).backend
    mounts = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "scratch", "mountPath": SCRATCH_DIR},
    ]
    if spec.model.volume:
        mounts.append({"name": "model", "mountPath": spec.model.source, "readOnly": True})
    if spec.model.compile_cache:
        # Read-only: the role's compile Job built the artifact before these pods started; none compiles again.
        mounts.append({"name": "compile-cache", "mountPath": COMPILE_CACHE_PATH, "readOnly": True})
    container: dict[str, Any] = {
        "name": "engine",
        "image": engine_image(owner, role, defaults),
        "imagePullPolicy": spec.image_pull_policy or defaults.image_pull_policy,
        "command": engine_command(role),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
            *([{"name": "kv", "containerPort": KV_PORT, "protocol": "TCP"}] if role == "prefill" else []),
        ],
        # Ready once the model is loaded and requests are accepted; alive while the server answers at all.
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
            # Compiling static graphs for an NPU takes minutes; the readiness probe gates traffic meanwhile.
            "initialDelaySeconds": 30,
        },
        "env": [{"name": "HOME", "value": SCRATCH_DIR}, {"name": "TMPDIR", "value": SCRATCH_DIR}, *_cpu_env()],
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "seccompProfile": defaults.npu.seccomp(backend),
        },
    }
    resources = _resources(owner, role, defaults)
    if resources:
        container["resources"] = resources
    return container


def _cpu_env() -> list[dict[str, Any]]:
    """The container's CPU limit and request (millicores, the downward API), from which the engine sizes its
    threads (atom_engine.cpu_allowance): the pod and its threads agree on the CPUs it has."""
    return [
        {"name": env, "valueFrom": {"resourceFieldRef": {"containerName": "engine", "resource": resource,
                                                          "divisor": "1m"}}}
        for env, resource in ((CPU_LIMIT_ENV, "limits.cpu"), (CPU_REQUEST_ENV, "requests.cpu"))
    ]


def _pod_spec(owner: Owner, role: WorkloadRole, defaults: Defaults) -> dict[str, Any]:
    spec = owner.spec.decode if role == "decode" else owner.spec.prefill
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_name(owner, role)}},
        {"name": "scratch", "emptyDir": {}},
    ]
    if owner.spec.model.volume:
        volumes.append({"name": "model", **owner.spec.model.volume})
    if owner.spec.model.compile_cache:
        volumes.append({"name": "compile-cache", **owner.spec.model.compile_cache})
    pod: dict[str, Any] = {
        "containers": [_container(owner, role, defaults)],
        "volumes": volumes,
        # SIGTERM: the engine drains (keeps serving while endpoints drop it), then finishes in-flight requests.
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "enableServiceLinks": False,  # hundreds of Services in a namespace would flood the environment
        "automountServiceAccountToken": False,  # the engine never calls the API server
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": ENGINE_UID,
            "runAsGroup": ENGINE_UID,
            "fsGroup": ENGINE_UID,
            # RuntimeDefault, or for RNGD pods a Localhost profile that also allows io_uring: both restricted.
            "seccompProfile": defaults.npu.seccomp(spec.backend),
        },
    }
    # The user's selector narrows the cluster profile's; the profile's labels (the vendor's feature discovery) win.
    node_selector = {**(spec.node_selector or {}), **defaults.npu.node_selector(spec.backend)}
    if node_selector:
        pod["nodeSelector"] = node_selector
    if spec.tolerations:
        pod["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    if spec.affinity:
        pod["affinity"] = spec.affinity
    return pod


def rollout_strategy(replicas: int) -> dict[str, Any]:
    """How a settings change replaces the role's pods.

    With two or more replicas, one pod at a time is replaced in place (maxSurge 0): NPU nodes are usually full,
    so a surge pod might never schedule, and the other replicas serve meanwhile. With a single replica that
    would leave the role with no pod for the whole restart (for prefill, every request fails with 503), so the
    new pod comes up beside the old one (maxSurge 1, maxUnavailable 0): the old pod serves until the new one is
    ready, and on a full node the rollout waits with the old pod still serving instead of causing an outage.
    """
    if replicas >= 2:
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def build_deployment(owner: Owner, role: WorkloadRole, config_hash: str, defaults: Defaults) -> dict[str, Any]:
    """The role's Deployment; ``config_hash`` is the digest of its ConfigMap, so new settings roll the pods."""
    spec = owner.spec.decode if role == "decode" else owner.spec.prefill
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, workload_name(owner, role), role),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(owner, role)},
            "strategy": rollout_strategy(spec.replicas),
            "template": {
                "metadata": {"labels": {**labels(owner, role), **traffic_selector(owner, role)},
                             "annotations": {CONFIG_HASH: config_hash}},
                "spec": _pod_spec(owner, role, defaults),
            },
        },
    }
