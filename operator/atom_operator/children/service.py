"""The Services: ``<name>`` in front of the decode pods (the OpenAI endpoint), headless ``<name>-prefill``."""

from __future__ import annotations

from typing import Any

from atom_operator.children.configmap import HTTP_PORT, KV_PORT
from atom_operator.children.meta import Owner, metadata, prefill_service_name, service_name, traffic_selector


def build_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, service_name(owner), "decode"),
        "spec": {
            "type": owner.spec.service.type,
            "selector": traffic_selector(owner, "decode"),
            "ports": [{"name": "http", "port": owner.spec.service.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_prefill_service(owner: Owner) -> dict[str, Any]:
    """Headless, so the name the decode pods are given resolves to every ready prefill pod; its ``kv`` port is
    the one they fetch KV from."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, prefill_service_name(owner), "prefill"),
        "spec": {
            "clusterIP": "None",
            "selector": traffic_selector(owner, "prefill"),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                      {"name": "kv", "port": KV_PORT, "targetPort": "kv", "protocol": "TCP"}],
        },
    }


def endpoint(owner: Owner) -> str:
    return f"http://{service_name(owner)}.{owner.namespace}.svc:{owner.spec.service.port}/v1"
