"""The admission webhook's server, certificates and ValidatingWebhookConfiguration.

Its settings are :class:`atom_operator.settings.WebhookSettings`.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from atom_operator.admission import MAX_OBJECT_DEPTH
from atom_operator.api import GROUP, PLURAL, VERSION
from atom_operator.api.kube import depth
from atom_operator.settings import WebhookSettings

WEBHOOK_NAME = f"validate.{PLURAL}.{GROUP}"
HANDLER_ID = "validate"
# The CRD's CEL rules refuse everything the webhook refuses, so an unreachable webhook only costs warnings:
# Ignore keeps `kubectl apply` working while the operator restarts. A webhook that answers in milliseconds
# needs no more than 5 s; a hung one then delays a write by 5 s, not by the 30 s maximum.
FAILURE_POLICY = "Ignore"
TIMEOUT_SECONDS = 5
# AdmissionReview wraps the object (request.object, plus managedFields that mirror its shape) a few levels deep.
MAX_REVIEW_DEPTH = MAX_OBJECT_DEPTH + 16


class Server(kopf.WebhookServer):
    """kopf's TLS webhook server that refuses an over-deep review itself instead of failing with a 500.

    kopf parses the review with the recursive ``json`` module and diffs objects recursively; a hostile object
    nested thousands of levels deep would raise RecursionError there. Such a request gets a clear refusal.
    """

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        text = await request.text()
        try:
            data = json.loads(text)
        except RecursionError:
            data = None
        except ValueError:
            return await kopf.WebhookServer._serve(fn, request)  # kopf answers malformed JSON itself
        if data is not None and depth(data) <= MAX_REVIEW_DEPTH:
            return await kopf.WebhookServer._serve(fn, request)
        uid = re.search(r'"uid"\s*:\s*"([-0-9a-fA-F]{1,64})"', text)
        return aiohttp.web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": uid.group(1) if uid else "",
                    "allowed": False,
                    "status": {
                        "code": 422,
                        "message": f"object: must be nested at most {MAX_OBJECT_DEPTH} levels deep",
                    },
                },
            }
        )


def make_certificates(directory: Path, hosts: Sequence[str]) -> tuple[Path, Path, Path]:
    """A fresh CA and a serving certificate for ``hosts`` signed by it: (ca.pem, tls.crt, tls.key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "atom-operator webhook CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "ca.pem", directory / "tls.crt", directory / "tls.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    paths[2].chmod(0o600)
    return paths


def server(settings: WebhookSettings) -> Server | None:
    """The webhook server as set, None when it is off; without a certificate, one is made for ``settings.host``."""
    if not settings.enabled:
        return None
    ca, cert, key = settings.ca, settings.cert, settings.key
    if not (cert and key):
        ca, cert, key = map(str, make_certificates(Path(tempfile.mkdtemp(prefix="atom-webhook-")), [settings.host]))
    return Server(addr=settings.addr, port=settings.port, host=settings.host, certfile=cert, pkeyfile=key, cafile=ca)


def configuration(
    client_config: dict[str, Any],
    *,
    name: str = WEBHOOK_NAME,
    namespace_selector: dict[str, Any] | None = None,
    resources: Sequence[tuple[str, str, str]] = ((GROUP, VERSION, PLURAL),),
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration for a chart or a test to apply.

    ``client_config`` is {url} or {service: {namespace, name, port, path}}, plus caBundle (base64 PEM); the
    handler is served under ``/validate``, as kopf routes by handler id.
    """
    client = dict(client_config)
    if "url" in client:
        client["url"] = client["url"].rstrip("/") + f"/{HANDLER_ID}"
    elif "service" in client:
        client["service"] = {**client["service"], "path": f"/{HANDLER_ID}"}
    hook: dict[str, Any] = {
        "name": WEBHOOK_NAME,  # a webhook's own name must be a three-part domain; the configuration's need not
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": FAILURE_POLICY,
        "timeoutSeconds": TIMEOUT_SECONDS,
        "matchPolicy": "Equivalent",
        "rules": [
            {
                "apiGroups": [group],
                "apiVersions": [version],
                "resources": [plural],
                "operations": ["CREATE", "UPDATE"],
                "scope": "Namespaced",
            }
            for group, version, plural in resources
        ],
        "clientConfig": client,
    }
    if namespace_selector is not None:
        hook["namespaceSelector"] = namespace_selector
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook],
    }


def ca_bundle(ca_file: str | Path) -> str:
    return base64.b64encode(Path(ca_file).read_bytes()).decode("ascii")
