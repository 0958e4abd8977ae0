"""The compile Job of one role: ``atom-engine compile`` once per artifact, into spec.model.compileCache.

The Job runs the role's own pod (same image, settings, volumes, placement and security) with the compile command
instead of ``serve``: the artifact it writes is keyed by exactly the settings the role's pods load it with (see
docs/architecture.md, "The compile cache"). It requests no NPU: the vendors' compilers run on the host. The role's
pods start once it succeeded (see :func:`atom_operator.children.build_children`) and mount the cache read-only, so
no pod compiles.
"""

from __future__ import annotations

import copy
from typing import Any

from atom_operator.children.configmap import CONFIG_PATH
from atom_operator.children.meta import ARTIFACT_KEY, Owner, WorkloadRole, build_name, digest, metadata

# Exit statuses of `atom-engine compile` that a retry cannot change (atom_engine.cli): 2 bad settings, 3 an artifact
# that disagrees with the settings. The Job fails at once with them; anything else (an evicted pod) is retried.
FINAL_EXIT_CODES = [2, 3]
BACKOFF_LIMIT = 2


def compile_command() -> list[str]:
    return ["atom-engine", "compile", "--config", CONFIG_PATH]


def artifact_key(config_data: dict[str, str], image: str) -> str:
    """What decides the artifact: the role's settings and the image (its SDK and compiler)."""
    return digest({"settings": config_data, "image": image})


def build_job(owner: Owner, role: WorkloadRole, pod: dict[str, Any], key: str) -> dict[str, Any]:
    """``pod`` is the role's pod template (see workload.build_deployment); ``key`` its artifact_key."""
    template = copy.deepcopy(pod)
    # Another component than the role's: the Services and the Deployment never select a compile pod.
    template["metadata"]["labels"]["app.kubernetes.io/component"] = f"{role}-build"
    spec = template["spec"]
    spec["restartPolicy"] = "Never"
    spec.pop("terminationGracePeriodSeconds", None)
    (container,) = spec["containers"]
    container["command"] = compile_command()
    for field in ("ports", "readinessProbe", "livenessProbe"):
        container.pop(field, None)
    # The compiler runs on the host CPU: the NPUs stay free for serving pods.
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        for name in [r for r in resources.get(kind, {}) if "/" in r]:
            del resources[kind][name]
        if kind in resources and not resources[kind]:
            del resources[kind]
    if not resources:
        container.pop("resources", None)
    # C3 writes a mismatch to /dev/termination-log; logs are the fallback for any other failure.
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    for mount in container["volumeMounts"]:
        if mount["name"] == "compile-cache":
            del mount["readOnly"]  # the one writer of the artifact (absent, not false: as the API server stores it)
    meta = metadata(owner, build_name(owner, role), role)
    meta["labels"]["app.kubernetes.io/component"] = f"{role}-build"
    meta["annotations"] = {ARTIFACT_KEY: key}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": "engine", "operator": "In", "values": FINAL_EXIT_CODES},
                    }
                ]
            },
            "template": template,
        },
    }

