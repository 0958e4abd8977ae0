"""Grafana dashboards as code: the engine, prefill/decode, the autoscaler and the operator, as Grafana's JSON.

``make dashboards`` (``python -m atom_operator.dashboards``) writes them to charts/atom-operator/dashboards/, which
the chart ships as ConfigMaps for Grafana's sidecar (monitoring.dashboards), and their panels' table into
docs/observability.md. tests/observability/test_dashboards.py holds them to what the engine and the operator
serve: every query parses, names a served metric and groups or matches by labels its series have.
"""

from __future__ import annotations

from atom_operator.dashboards import autoscaler, control, engine, pd
from atom_operator.dashboards.grafana import Dashboard

DASHBOARDS: tuple[Dashboard, ...] = (engine.DASHBOARD, pd.DASHBOARD, autoscaler.DASHBOARD, control.DASHBOARD)
