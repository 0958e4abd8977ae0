"""The chart rendered by the real helm, and prometheus-operator's real CRDs to check its objects against.

The CRDs come from the prometheus-operator module that hack/tools/prometheus-operator/go.mod pins (Go's module
cache, atom_localcluster.tools.module_dir). An object is checked as an API server with strict field validation
would: against the served version's openAPIV3Schema, and with no field the schema does not know (which the API
server would drop, so a misspelled key would silently do nothing).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from atom_localcluster import tools

CHART = Path(__file__).resolve().parents[2] / "charts" / "atom-operator"


def render(values: dict[str, Any], release: str = "t", namespace: str = "monitoring-test") -> list[dict]:
    """``helm template`` of the chart with ``values`` (given as one values file on stdin)."""
    out = subprocess.run([str(tools.path("helm")), "template", release, str(CHART), "-n", namespace, "-f", "-"],
                         input=yaml.safe_dump(values), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


class _CRDLoader(yaml.SafeLoader):
    """PyYAML reads a bare ``=`` (an enum value in these CRDs: a relabeling's action) as YAML 1.1's value tag."""


_CRDLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


@functools.cache
def schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the openAPIV3Schema of each served version of prometheus-operator's CRDs."""
    out = {}
    crds = tools.module_dir("prometheus-operator") / "example" / "prometheus-operator-crd"
    for path in sorted(crds.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=_CRDLoader)  # noqa: S506 - a SafeLoader
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                out[key] = version["schema"]["openAPIV3Schema"]
    return out


def validate(obj: dict) -> None:
    """Raise if the API server would refuse ``obj``, or drop one of its fields."""
    schema = schemas()[(obj["apiVersion"], obj["kind"])]
    # Not checked as a schema first: its patterns are Go's RE2 (``^(?i)(abort|warn)?$``), which Python's re refuses
    # where a flag sits after ``^``; a pattern is compiled only for a field the object has.
    jsonschema.Draft4Validator(schema).validate(obj)
    unknown = list(_unknown_fields(obj, schema, ""))
    assert not unknown, f"{obj['kind']} {obj['metadata']['name']}: fields the CRD does not know: {unknown}"


def _unknown_fields(value: Any, schema: dict, path: str):  # noqa: ANN202
    if path in (".metadata",) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return  # ObjectMeta is the API server's own; a preserved subtree takes anything
    if isinstance(value, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, sub in value.items():
            if props is not None and key in props:
                yield from _unknown_fields(sub, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                yield from _unknown_fields(sub, extra, f"{path}.{key}")
            elif props is not None:
                yield f"{path}.{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _unknown_fields(item, schema["items"], f"{path}[{i}]")
