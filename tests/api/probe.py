"""The probe CRD's names: a schemaless copy of the AtomDeployment CRD whose objects the webhook also reviews.

The probe CRD (group probe.serving.atom.dev) has no schema and no CEL rules, so whatever the API server
refuses there, the webhook refused. That is how the tests see the webhook judge every case on its own: the
operator reviews whatever its ValidatingWebhookConfiguration sends it, and the tests' configuration (tests/api/
conftest.py) sends it the probe's objects too.
"""

PROBE_GROUP = "probe.serving.atom.dev"
# Its own kind, so that `kubectl get atomdeployment` and `kubectl explain` stay unambiguous.
PROBE_KIND = "AtomDeploymentProbe"
PROBE_PLURAL = "atomdeploymentprobes"
