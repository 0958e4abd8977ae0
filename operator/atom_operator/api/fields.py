"""Kubernetes-shaped field types shared by the spec models, each with the schema the CRD needs."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema
from pydantic.alias_generators import to_camel

# Free-form objects (affinity, volume) are not typed here, so nothing bounds their depth in the CRD; the models
# (and so the webhook) refuse anything deeper than any real affinity or volume source could be.
MAX_FREE_FORM_DEPTH = 32
MAX_MAP_ENTRIES = 32
MAX_TOLERATIONS = 32
LABEL_KEY_MAX = 317  # 253-character prefix, "/", 63-character name
LABEL_VALUE_MAX = 63


class Strict(BaseModel):
    """Spec objects: camelCase on the wire, no type coercion and no unknown fields, as the API server does."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)


def depth(value: object) -> int:
    """Nesting depth of a JSON-like value, without recursion (a hostile object must not exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_FREE_FORM_DEPTH:
            return deepest
        stack.extend((c, level + 1) for c in children)
    return deepest


def _shallow(value: dict[str, Any]) -> dict[str, Any]:
    found = depth(value)
    if found > MAX_FREE_FORM_DEPTH:
        raise ValueError(f"must be nested at most {MAX_FREE_FORM_DEPTH} levels deep; got more than {found - 1}")
    return value


FreeForm = Annotated[
    dict[str, Any],
    AfterValidator(_shallow),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]

# The API server's own quantity syntax, e.g. 2, 500m, 16Gi.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

_QUANTITY = re.compile(QUANTITY_PATTERN)


def _quantity(value: object) -> int | str:
    # One message for both branches of int-or-string, instead of one error per union member.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and len(value) <= 64 and _QUANTITY.match(value):
        return value
    raise ValueError(f"must be a quantity such as 2, 500m or 16Gi (at most 64 characters); got {value!r:.64}")


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "maxLength": 64,
            "pattern": QUANTITY_PATTERN,
        }
    ),
]

# Keys are not length-checked: a structural schema cannot bound them, and the model must agree with the CRD.
LabelMap = Annotated[
    dict[str, Annotated[str, Field(max_length=LABEL_VALUE_MAX)]],
    Field(max_length=MAX_MAP_ENTRIES),
]


class Resources(Strict):
    """Compute resources of one container, as in a Pod (the NPU resource is added by the operator)."""

    limits: dict[str, Quantity] | None = Field(
        None, max_length=MAX_MAP_ENTRIES, description="Most of each resource the container may use, e.g. memory: 16Gi."
    )
    requests: dict[str, Quantity] | None = Field(
        None, max_length=MAX_MAP_ENTRIES, description="Resources the scheduler reserves for the container, e.g. cpu: 2."
    )


class Toleration(Strict):
    """A Pod toleration, as in core/v1."""

    key: str | None = Field(None, max_length=LABEL_KEY_MAX, description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal (the default).")
    value: str | None = Field(None, max_length=LABEL_VALUE_MAX, description="Taint value to match with Equal.")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None, description="How long a NoExecute taint is tolerated before eviction; unset means forever."
    )
