"""The AtomDeployment object and its validation into field-named problems, as the API server words them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from atom_operator.api import rules
from atom_operator.api.spec import AtomDeploymentSpec
from atom_operator.api.status import AtomDeploymentStatus

GROUP = "serving.atom.dev"
VERSION = "v1alpha1"
KIND = "AtomDeployment"
PLURAL = "atomdeployments"
SHORT_NAME = "atomdep"


class ObjectMeta(BaseModel):
    """The part of metadata the API reads; the rest passes through untouched."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    namespace: str | None = None


class AtomDeployment(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    api_version: str = Field(f"{GROUP}/{VERSION}", alias="apiVersion")
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: AtomDeploymentSpec
    status: AtomDeploymentStatus | None = None

    @field_validator("metadata")
    @classmethod
    def _root_limits(cls, metadata: ObjectMeta) -> ObjectMeta:
        # Root rules read only metadata, so they are checked even when the spec is broken, as CEL does.
        view = rules.SpecView(
            lanes=1,
            kv_blocks=2,
            prefix_cache=False,
            local_prefill=True,
            prefetch_next=False,
            prefill_replicas=0,
            name=metadata.name,
        )
        broken = [r for r in rules.RULES if r.root and r.violated(view)]
        if broken:
            raise PydanticCustomError(
                "engine_limit",
                "{summary}",
                {
                    "summary": "; ".join(r.render(view) for r in broken),
                    "violations": tuple((r.field, r.render(view)) for r in broken),
                },
            )
        return metadata


@dataclass(frozen=True)
class Problem:
    """One reason an object is refused: the field, and a message naming the bound and the actual value."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def problems(obj: Mapping[str, Any]) -> list[Problem]:
    """Everything wrong with an AtomDeployment (a dict as the API server stores it); empty when valid."""
    try:
        AtomDeployment.model_validate(obj)
    except ValidationError as e:
        return [p for err in e.errors(include_url=False) for p in _explain(err)]
    return []


def _explain(err: Any) -> list[Problem]:
    if err["type"] == "engine_limit":
        return [Problem(field, message) for field, message in err["ctx"]["violations"]]
    field = ""
    for part in err["loc"]:  # spec.decode.tolerations[0].operator, as the API server writes paths
        if isinstance(part, int):
            field += f"[{part}]"
        elif not part.startswith(("function-", "constrained-")):
            field += f".{part}" if field else part
    field = field or "object"
    if err["type"] == "value_error":  # our own validators already name the bound and the value
        return [Problem(field, str(err["ctx"]["error"]))]
    message = err["msg"]
    value = err.get("input")
    if isinstance(value, bool | int | float | str) and err["type"] not in ("missing", "extra_forbidden"):
        shown = f"a string of {len(value)} characters" if isinstance(value, str) and len(value) > 64 else repr(value)
        message = f"{message}; got {shown}"
    return [Problem(field, message)]
