"""The operator dashboard: the control plane, each AtomDeployment's conditions and the operator's own work.

``atom_deployment_*`` carry the AtomDeployment's namespace (every replica serves them: ``max by``); the operator's
own ``atom_operator_*`` series carry the operator pod's namespace, so those panels do not follow the namespace
variable.
"""

from __future__ import annotations

from atom_operator.dashboards import variables as v
from atom_operator.dashboards.grafana import Dashboard, Panel, Target
from atom_operator.dashboards.promql import quantiles, rate, selector

D = v.DEPLOYMENT
READY = f'{D}, type="Ready", status="True"'

PANELS = (
    Panel("Replicas leading", (Target("sum(max by (namespace, pod) (atom_operator_leader))", "leading"),), "none",
          kind="stat", width=6, description="Operator replicas holding the Lease: 1 is healthy; 0 means nothing"
                                            " reconciles or autoscales (AtomOperatorNotLeading)."),
    Panel("AtomDeployments watched", (Target("max(atom_operator_atomdeployments)", "watched"),), "none",
          kind="stat", width=6, description="AtomDeployments in the operator's store."),
    Panel("Leader", (Target("max by (namespace, pod) (atom_operator_leader)", "{{pod}}"),), width=12,
          description="1 while the replica holds the Lease."),
    Panel("Conditions", (
        Target(f"max by (namespace, atomdeployment, type, status) ({selector('atom_deployment_condition', D)}) == 1",
               "", instant=True),),
          kind="table", width=12, description="Each deployment's condition types with their current status (Ready,"
                                              " Progressing, Degraded, ArtifactReady, routing, scaling)."),
    Panel("Reasons", (
        Target(f"max by (namespace, atomdeployment, type, reason) ({selector('atom_deployment_condition_reason', D)})",
               "", instant=True),),
          kind="table", width=12, description="Each condition type's current reason."),
    Panel("Ready", (
        Target(f"max by (namespace, atomdeployment) ({selector('atom_deployment_condition', READY)})",
               "{{namespace}}/{{atomdeployment}}"),),
          description="1 while the deployment's Ready condition is True."),
    Panel("Pods per role: desired and ready", (
        Target(f"max by (atomdeployment, role, state) ({selector('atom_deployment_replicas', v.SELECTED)})",
               "{{atomdeployment}} {{role}} {{state}}"),),
          description="Each role's desired and ready pods, from the AtomDeployment's status."),
    Panel("Reconciles by result", (Target(rate("atom_operator_reconciles_total", "", "result"), "{{result}}"),),
          "ops", description="unchanged, changed, retry, error: reconciles per second over the replicas."),
    Panel("Reconcile errors by kind", (Target(rate("atom_operator_errors_total", "", "kind"), "{{kind}}"),),
          "ops", description="Failed reconciles by kind of error (an HTTP status, an exception's type)."),
    Panel("Reconcile duration", quantiles("atom_operator_reconcile_duration_seconds", "", "", ""), "s",
          description="One reconcile, over every replica."),
    Panel("Work queue depth", (Target("max by (pod) (atom_operator_queue_depth)", "{{pod}}"),),
          description="AtomDeployments waiting to be reconciled."),
    Panel("Children written", (Target(rate("atom_operator_child_writes_total", "", "action"), "{{action}}"),),
          "ops", description="Child objects written per second, by action."),
    Panel("Informer relists", (Target(rate("atom_operator_relists_total", "", "kind"), "{{kind}}"),),
          "ops", description="Complete listings (start, a broken or expired watch, a resync), by kind."),
)

DASHBOARD = Dashboard("atom-operator", "ATOM / Operator", "The operator's work and each AtomDeployment's"
                      " conditions and pods.", v.DEPLOYMENTS, PANELS)
