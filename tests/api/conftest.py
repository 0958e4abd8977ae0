"""One operator (webhook on 127.0.0.1, a generated CA) for the session; CRD-only and webhook namespaces."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from atom_operator import webhook
from atom_operator.api.crd import render

from tests.api.probe import PROBE_GROUP, PROBE_KIND, PROBE_PLURAL

REPO = Path(__file__).resolve().parents[2]
WEBHOOK_LABEL = "serving.atom.dev/webhook-test"
PROBE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PROBE_PLURAL}.{PROBE_GROUP}"},
    "spec": {
        "group": PROBE_GROUP,
        "scope": "Namespaced",
        "names": {"kind": PROBE_KIND, "plural": PROBE_PLURAL, "singular": PROBE_KIND.lower()},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="session")
def crds(cluster):
    cluster.kubectl("apply", "-f", "-", input=render())
    cluster.apply(PROBE_CRD)
    for name in ("atomdeployments.serving.atom.dev", f"{PROBE_PLURAL}.{PROBE_GROUP}"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return cluster


@pytest.fixture(scope="session")
def operator(crds, operator_process) -> Iterator[subprocess.Popen]:
    """The session's one operator (tests/conftest.py); its webhook registered for labelled namespaces only."""
    cluster = crds
    port, ca = operator_process.webhook_port, operator_process.ca
    proc = operator_process.proc
    config = webhook.configuration(
        {"url": f"https://127.0.0.1:{port}", "caBundle": webhook.ca_bundle(ca)},
        name="atom-webhook-test",
        namespace_selector={"matchLabels": {WEBHOOK_LABEL: "on"}},
        resources=[("serving.atom.dev", "v1alpha1", "atomdeployments"), (PROBE_GROUP, "v1alpha1", PROBE_PLURAL)],
    )
    cluster.apply(config)
    probe_ns = "webhook-ready-probe"
    cluster.kubectl("create", "namespace", probe_ns, check=False)
    cluster.kubectl("label", "namespace", probe_ns, f"{WEBHOOK_LABEL}=on", "--overwrite")
    # failurePolicy is Ignore, so wait until the webhook itself answers (a refusal only it can give).
    bad = {"apiVersion": f"{PROBE_GROUP}/v1alpha1", "kind": PROBE_KIND,
           "metadata": {"name": "probe", "namespace": probe_ns}, "spec": {"bogus": 1}}  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(bad), check=False)
        if "denied the request" in out.stderr:
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("operator webhook did not come up:\n" + operator_process.log()[-4000:])
        time.sleep(0.5)
    try:
        yield proc
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", "atom-webhook-test", check=False)
        cluster.kubectl("delete", "namespace", probe_ns, "--wait=false", check=False)


def _namespace(cluster, name: str, webhook_on: bool) -> Iterator[str]:
    cluster.kubectl("create", "namespace", name)
    if webhook_on:
        cluster.kubectl("label", "namespace", name, f"{WEBHOOK_LABEL}=on")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def crd_ns(crds) -> Iterator[str]:
    """A namespace the webhook does not watch: only the CRD's schema and CEL rules judge."""
    yield from _namespace(crds, f"api-crd-only-{os.getpid()}", webhook_on=False)


@pytest.fixture(scope="module")
def hook_ns(operator, crds) -> Iterator[str]:
    yield from _namespace(crds, f"api-webhook-{os.getpid()}", webhook_on=True)
