"""The autoscaler dashboard: what each autoscaled AtomDeployment's pods asked for and what it decided.

Read from the operator's /metrics. Every operator replica serves the ``atom_deployment_*`` series (each watches the
same statuses), so they are taken with ``max by``. ``atom_autoscaler_decisions_total``, ``_drain_seconds``,
``_scrape_*`` carry no deployment (their ``namespace`` is the operator's): those panels follow the role alone.
"""

from __future__ import annotations

from atom_operator.dashboards import variables as v
from atom_operator.dashboards.grafana import Dashboard, Panel, Target
from atom_operator.dashboards.promql import quantiles, rate, selector

LEGEND = "{{atomdeployment}} {{role}}"
S, D = v.SELECTED, v.DEPLOYMENT
ROLE = 'role=~"$role"'
SCALING = f'{D}, type=~"ScalingActive|ScalingLimited|AbleToScale", status="True"'
LIMITED = f'{D}, type="ScalingLimited"'


def by_role(metric: str, what: str) -> Target:
    return Target(f"max by (atomdeployment, role) ({selector(metric, S)})", f"{LEGEND} {what}")


PANELS = (
    Panel("Replicas: desired and ready", (
        Target(f"max by (atomdeployment, role, state) ({selector('atom_deployment_replicas', S)})",
               f"{LEGEND} {{{{state}}}}"),),
          description="Each role's pods as the AtomDeployment's status shows them: desired (the spec's count, or"
                      " the autoscaler's) and ready."),
    Panel("Autoscaler: decided and recommended", (
        by_role("atom_autoscaler_desired_replicas", "decided"),
        by_role("atom_autoscaler_recommended_replicas", "recommended by its own demand")),
          description="Replicas the last decision set, and what the role's own demand asked for (they differ where"
                      " a limit or the prefill/decode ratio holds it)."),
    Panel("Demand", (by_role("atom_autoscaler_demand", "demand"),),
          description="The demand the last decision read: decode in sequences, prefill in prompt tokens per second."),
    Panel("Decisions", (Target(rate("atom_autoscaler_decisions_total", ROLE, "role, direction"),
                               "{{role}} {{direction}}"),),
          "ops", description="Decisions per second by direction (up, down, none), over every deployment."),
    Panel("Scaling conditions", (
        Target(f"max by (atomdeployment, type) ({selector('atom_deployment_condition', SCALING)})",
               "{{atomdeployment}} {{type}}"),),
          description="1 while the condition is True: ScalingActive (the pods' metrics were read), ScalingLimited"
                      " (a limit holds the decision), AbleToScale."),
    Panel("Why scaling is limited", (
        Target(f"max by (atomdeployment, reason) ({selector('atom_deployment_condition_reason', LIMITED)})",
               "{{atomdeployment}} {{reason}}", instant=True),),
          kind="table", description="ScalingLimited's current reason per deployment (AtMaxReplicas, AtMinReplicas,"
                                    " NPUBudget, InsufficientNPUs, RatioAdjusted)."),
    Panel("Drain time", quantiles("atom_autoscaler_drain_seconds", ROLE, "role", "{{role}}"), "s",
          description="From a pod's cordon to its release, when the autoscaler scales down."),
    Panel("Drains timed out", (
        Target(f"max by (atomdeployment, role) (increase({selector('atom_autoscaler_drain_timeouts_total', S)}"
               "[1h]))", LEGEND),),
          description="Drained pods released still busy after drain.timeoutSeconds, over the last hour."),
    Panel("Pod scrapes", (
        Target(rate("atom_autoscaler_scrape_errors_total", "", "pod"), "{{pod}} failed"),
        Target(f"histogram_quantile(0.9, {rate('atom_autoscaler_scrape_seconds_bucket', '', 'le, pod')})",
               "{{pod}} round p90 (s)")),
          description="Pod scrapes that failed or timed out, per operator replica, and one round's p90."),
)

DASHBOARD = Dashboard("atom-autoscaler", "ATOM / Autoscaler", "Each autoscaled AtomDeployment's replicas, demand,"
                      " decisions, limits and drains.", v.DEPLOYMENTS, PANELS)
