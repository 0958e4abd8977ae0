"""``AtomDeployment.status``: written by the operator, read by users, ``kubectl get`` and the scale subresource."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Status(BaseModel):
    # Status is the operator's own output; tolerate fields a newer operator wrote.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(_Status):
    """A metav1.Condition: Ready, Progressing, Degraded or ArtifactReady."""

    type: str = Field(
        max_length=316,
        description="Ready, Progressing, Degraded or ArtifactReady; with spec.autoscaling also HPA's ScalingActive,"
        " ScalingLimited and AbleToScale.",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation the condition is about.")
    last_transition_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="When status last changed (RFC 3339)."
    )
    reason: str | None = Field(None, max_length=1024, description="CamelCase reason of the last transition.")
    message: str | None = Field(None, max_length=32768, description="What happened, in plain words.")


class RoleStatus(_Status):
    """Pods of one role, as its Deployment reports them."""

    replicas: int = Field(0, ge=0, description="Pods that exist.")
    ready_replicas: int = Field(0, ge=0, description="Pods that are Ready (model loaded, accepting requests).")
    updated_replicas: int = Field(0, ge=0, description="Pods running the current settings.")
    summary: str | None = Field(None, max_length=32, description="ready/desired, shown by kubectl get.")


class RoleScalingStatus(_Status):
    """One role as the autoscaler last decided it."""

    desired_replicas: int | None = Field(None, ge=0, description="Replicas the role is set to now.")
    recommended_replicas: int | None = Field(
        None, ge=0, description="Replicas its own demand asks for, before windows, pace, band and budget."
    )
    draining_pods: int = Field(0, ge=0, description="Pods cordoned and waiting to be idle before they go.")
    last_scale_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="When desiredReplicas last changed (RFC 3339)."
    )
    demand: str | None = Field(None, max_length=256, description="The demand the decision read, in its units.")


class AutoscalingStatus(_Status):
    """What spec.autoscaling decided last, and why (its HPA conditions are in status.conditions)."""

    last_decision_time: str | None = Field(
        None,
        json_schema_extra={"format": "date-time"},
        description="When the decision this status reports was made (RFC 3339). A decision that changes nothing"
        " here is not written, so an idle deployment costs no writes; its conditions are in status.conditions.",
    )
    decode: RoleScalingStatus | None = Field(None, description="The decode role.")
    prefill: RoleScalingStatus | None = Field(None, description="The prefill workers.")
    current_ratio: str | None = Field(
        None, max_length=32, description="prefill:decode of the desired replicas, e.g. 1:2."
    )
    reason: str | None = Field(None, max_length=1024, description="The last decision in one line.")


class AtomDeploymentStatus(_Status):
    """What the operator observed the last time it reconciled."""

    observed_generation: int | None = Field(None, ge=0, description="metadata.generation last reconciled.")
    conditions: list[Condition] | None = Field(
        None,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Progressing and Degraded; ArtifactReady with spec.model.compileCache; with"
        " spec.autoscaling, HPA's ScalingActive (metrics read), ScalingLimited (bounds, ratio band or NPU budget held"
        " a role) and AbleToScale (a drain, a rollout or a window holds a change).",
    )
    decode: RoleStatus | None = Field(None, description="Decode pods; decode.replicas backs the scale subresource.")
    prefill: RoleStatus | None = Field(None, description="Prefill worker pods.")
    endpoint: str | None = Field(
        None, max_length=1024, description="OpenAI base URL, http://<name>.<namespace>.svc:<port>/v1."
    )
    selector: str | None = Field(
        None, max_length=4096, description="Label selector of the decode pods, for the scale subresource (HPA)."
    )
    autoscaling: AutoscalingStatus | None = Field(None, description=AutoscalingStatus.__doc__)
    artifact: str | None = Field(
        None,
        max_length=32,
        description="The compiled artifacts of spec.model.compileCache, shown by kubectl get: Compiling, Ready,"
        " Failed or Mismatch (the ArtifactReady condition says which role and why); unset without a compile cache.",
    )
