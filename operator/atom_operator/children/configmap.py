"""The ConfigMap of one role: the engine settings YAML its pods read with ``--config``."""

from __future__ import annotations

from typing import Any

from atom_engine.settings import EngineSettings

from atom_operator.api import engine_settings
from atom_operator.children.meta import Defaults, Owner, WorkloadRole, config_name, metadata, prefill_service_name

CONFIG_KEY = "engine.yaml"
CONFIG_DIR = "/etc/atom"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
HTTP_PORT = 8000
KV_PORT: int = EngineSettings.model_fields["pd_kv_port"].default  # the prefill pods' KV transport


def prefill_address(owner: Owner) -> str:
    """host:port of the prefill workers' KV transport: the headless Service resolves to every ready prefill pod."""
    return f"{prefill_service_name(owner)}.{owner.namespace}.svc:{KV_PORT}"


def build_configmap(owner: Owner, role: WorkloadRole, defaults: Defaults) -> dict[str, Any]:
    workers = prefill_address(owner) if role == "decode" and owner.spec.prefill.replicas >= 1 else None
    spec = owner.spec.decode if role == "decode" else owner.spec.prefill
    pes = defaults.npu.rngd_pes(spec.backend, spec.npus_per_replica)  # a partition of a card fuses fewer PEs
    settings = engine_settings(owner.spec, role, name=owner.name, prefill_workers=workers, rngd_pes=pes)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, config_name(owner, role), role),
        "data": {CONFIG_KEY: settings.dump()},
    }
