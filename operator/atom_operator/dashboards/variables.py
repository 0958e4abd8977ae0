"""The dashboards' template variables: which namespace, AtomDeployment and role a panel shows.

The engine dashboards take them from the labels the chart's PodMonitor gives every engine series (the target's
``namespace``, ``atomdeployment`` and ``role`` from the pod's labels); the control-plane dashboards from the
operator's ``atom_deployment_replicas``, labelled with each AtomDeployment's own namespace. Each variable lists
the values left by the ones before it, and each allows several values (Grafana joins them as a regex).
"""

from __future__ import annotations

from atom_operator.dashboards.grafana import Variable


def chain(metric: str, roles: bool = True) -> tuple[Variable, ...]:
    """namespace, atomdeployment (and role) from ``metric``'s series, each narrowed by the ones before it."""
    ns = 'namespace=~"$namespace"'
    out = (Variable("namespace", "namespace", metric, "Namespace"),
           Variable("atomdeployment", "atomdeployment", f"{metric}{{{ns}}}", "AtomDeployment"))
    if roles:
        out += (Variable("role", "role", f'{metric}{{{ns}, atomdeployment=~"$atomdeployment"}}', "Role"),)
    return out


# vllm:num_requests_running: every engine role serves it from its start (decode, prefill, standalone).
ENGINES = chain("vllm:num_requests_running")
DEPLOYMENTS = chain("atom_deployment_replicas")

# The matchers of a panel that follows the variables: all three, or (a series with no role) the first two.
DEPLOYMENT = 'namespace=~"$namespace", atomdeployment=~"$atomdeployment"'
SELECTED = f'{DEPLOYMENT}, role=~"$role"'
