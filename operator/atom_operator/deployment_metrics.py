"""Each AtomDeployment's status as metrics, so a dashboard and the alerts show the control plane beside the engines:
its conditions (``atom_deployment_condition``, ``atom_deployment_condition_reason``) and each role's desired and
ready pods (``atom_deployment_replicas``).

Read from the status as the controller stores it (:meth:`atom_operator.controller.Controller.event`): the
reconciler's own write comes back through there, and so does what the autoscaler writes into status.conditions
itself, so the series follow every writer of status from one place. A deployment's series go with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Gauge

from atom_operator import status as owner_status
from atom_operator import telemetry
from atom_operator.children.meta import ROLES

Key = tuple[str, str]
STATUSES = ("True", "False", "Unknown")
# family -> the label values after namespace and atomdeployment -> value
Series = dict[str, dict[tuple[str, ...], float]]
GAUGES: dict[str, Gauge] = {
    g.describe()[0].name: g for g in (telemetry.CONDITION, telemetry.CONDITION_REASON, telemetry.REPLICAS)
}


def series(status: Mapping[str, Any] | None) -> Series:
    """The series of one AtomDeployment's ``status`` (pure). A condition has a series for each status, 1 for its
    own (as kube-state-metrics writes conditions: a query for status="True" finds a 0 rather than nothing), and one
    for its reason; each role its ready pods, and its desired ones once a summary carries them."""
    status = status or {}
    out: Series = {name: {} for name in GAUGES}
    for c in status.get("conditions") or []:
        if not isinstance(c, dict) or not c.get("type"):
            continue
        for s in STATUSES:
            out["atom_deployment_condition"][c["type"], s] = float(c.get("status") == s)
        if c.get("reason"):
            out["atom_deployment_condition_reason"][c["type"], c["reason"]] = 1.0
    for role in ROLES:
        counts = status.get(role)
        if not isinstance(counts, dict):
            continue
        out["atom_deployment_replicas"][role, "ready"] = float(counts.get("readyReplicas") or 0)
        desired = owner_status.desired_of(counts.get("summary"))
        if desired is not None:
            out["atom_deployment_replicas"][role, "desired"] = float(desired)
    return out


class Published:
    """The series set for each AtomDeployment: set anew from each status, and those it no longer has removed (a
    condition's reason changed, a condition went), all of them when the deployment goes."""

    def __init__(self) -> None:
        self._sets: dict[Key, Series] = {}

    def publish(self, key: Key, status: Mapping[str, Any] | None) -> None:
        new, old = series(status), self._sets.get(key, {})
        for name, gauge in GAUGES.items():
            for labels in old.get(name, {}).keys() - new[name].keys():
                gauge.remove(*key, *labels)
            for labels, value in new[name].items():
                gauge.labels(*key, *labels).set(value)
        self._sets[key] = new

    def forget(self, key: Key) -> None:
        for name, labelled in self._sets.pop(key, {}).items():
            for labels in labelled:
                GAUGES[name].remove(*key, *labels)
