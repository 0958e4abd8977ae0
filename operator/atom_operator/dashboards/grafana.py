"""Grafana's dashboard schema as plain dicts: a dashboard, its template variables, its panels and their targets.

Every panel and variable reads the Prometheus data source the viewer picks (the ``datasource`` variable, of type
prometheus), so one JSON works against any Grafana. Panels are laid out left to right on Grafana's 24-column grid
in the order given, each row as tall as its tallest panel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 39  # Grafana 10.4/11's dashboard schema
GRID_COLUMNS = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana's range for rate(): at least four scrape intervals, so a rate never falls between two samples.
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel; ``legend`` names its series (``{{label}}`` takes a label's value)."""

    expr: str
    legend: str = ""
    instant: bool = False  # a table of the latest values instead of a series over time

    def json(self, ref: str) -> dict[str, Any]:
        out: dict[str, Any] = {"refId": ref, "datasource": DATASOURCE, "expr": self.expr, "legendFormat": self.legend,
                               "range": not self.instant, "instant": self.instant}  # fmt: skip
        if self.instant:
            out["format"] = "table"
        return out


@dataclass(frozen=True)
class Panel:
    """A panel: a time series by default; ``stat`` (the latest value, big) or ``table`` (instant targets)."""

    title: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    width: int = 12
    height: int = 8
    mappings: tuple[tuple[str, str], ...] = ()  # value -> text, e.g. a breaker state's 2 -> open

    def json(self, panel_id: int, x: int, y: int) -> dict[str, Any]:
        defaults: dict[str, Any] = {"unit": self.unit}
        if self.mappings:
            defaults["mappings"] = [{"type": "value", "options": {
                value: {"text": text, "index": i} for i, (value, text) in enumerate(self.mappings)}}]
        return {
            "id": panel_id,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": DATASOURCE,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
            if self.kind == "timeseries" else {},
            "targets": [t.json(chr(ord("A") + i)) for i, t in enumerate(self.targets)],
        }


@dataclass(frozen=True)
class Variable:
    """A template variable whose values are a label's on a metric's series: ``label_values(selector, label)``."""

    name: str
    label: str
    selector: str  # a series selector, which may use the variables before this one
    title: str = ""

    @property
    def query(self) -> str:
        return f"label_values({self.selector}, {self.label})"

    def json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.title or self.name,
            "type": "query",
            "datasource": DATASOURCE,
            "definition": self.query,
            "query": {"query": self.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,  # on each change of the time range: a new deployment shows up without a reload
            "includeAll": True,
            "allValue": ".*",
            "multi": True,
            "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [],
            "hide": 0,
        }


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = field(default=("atom",))

    def json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "editable": True,
            "graphTooltip": 1,  # a shared crosshair: one instant across every panel
            "time": {"from": "now-1h", "to": "now"},
            "refresh": "30s",
            "timezone": "browser",
            "annotations": {"list": []},
            "links": [],
            "templating": {"list": [datasource_variable(), *(v.json() for v in self.variables)]},
            "panels": layout(self.panels),
        }


def datasource_variable() -> dict[str, Any]:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "options": [], "hide": 0, "refresh": 1, "regex": ""}  # fmt: skip


def layout(panels: tuple[Panel, ...]) -> list[dict[str, Any]]:
    """Each panel's gridPos: left to right, a new row when the next one does not fit."""
    out, x, y, row_height = [], 0, 0, 0
    for i, p in enumerate(panels, 1):
        if x + p.width > GRID_COLUMNS:
            x, y, row_height = 0, y + row_height, 0
        out.append(p.json(i, x, y))
        x, row_height = x + p.width, max(row_height, p.height)
    return out
