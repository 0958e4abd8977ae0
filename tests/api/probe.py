"""Test-only kopf module: the same validate handler, also for a schemaless copy of the CRD.

The probe CRD (group probe.serving.atom.dev) has no schema and no CEL rules, so whatever the API server
refuses there, the webhook refused. That is how the tests see the webhook judge every case on its own.
"""

import kopf
from atom_operator import main, webhook

PROBE_GROUP = "probe.serving.atom.dev"
# Its own kind, so that `kubectl get atomdeployment` and `kubectl explain` stay unambiguous.
PROBE_KIND = "AtomDeploymentProbe"
PROBE_PLURAL = "atomdeploymentprobes"

kopf.on.validate(PROBE_GROUP, "v1alpha1", PROBE_PLURAL, id=webhook.HANDLER_ID, operations=["CREATE", "UPDATE"])(
    main.validate
)
