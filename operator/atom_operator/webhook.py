"""The admission webhook's server, certificates and ValidatingWebhookConfiguration.

Its settings are :class:`atom_operator.config.WebhookSettings`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import logging
import re
import ssl
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp.web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from atom_operator.admission import MAX_OBJECT_DEPTH, Verdict
from atom_operator.api import GROUP, PLURAL, VERSION
from atom_operator.api.fields import depth
from atom_operator.config import WebhookSettings

log = logging.getLogger(__name__)
WEBHOOK_NAME = f"validate.{PLURAL}.{GROUP}"
REVIEW_PATH = "/validate"
# The CRD's CEL rules refuse everything the webhook refuses, so an unreachable webhook only costs warnings:
# Ignore keeps `kubectl apply` working while the operator restarts. A webhook that answers in milliseconds
# needs no more than 5 s; a hung one then delays a write by 5 s, not by the 30 s maximum.
FAILURE_POLICY = "Ignore"
TIMEOUT_SECONDS = 5
# AdmissionReview wraps the object (request.object, plus managedFields that mirror its shape) a few levels deep.
MAX_REVIEW_DEPTH = MAX_OBJECT_DEPTH + 16
MAX_REVIEW_BYTES = 8 * 1024 * 1024  # above the API server's own limit on an object (about 3 MB in etcd)
CERTIFICATE_CHECK_SECONDS = 60


Review = Callable[[Any, Any, "str | None"], Verdict]  # (object, old object, namespace) -> the verdict


class WebhookServer:
    """HTTPS on the settings' address: ``POST /validate`` takes an AdmissionReview and answers it with ``review``'s
    verdict. The certificate files are read again when they change (cert-manager renews them in place)."""

    def __init__(self, settings: WebhookSettings, review: Review) -> None:
        self.settings, self.review = settings, review
        ca, cert, key = settings.ca, settings.cert, settings.key
        if not (cert and key):
            ca, cert, key = map(str, make_certificates(Path(tempfile.mkdtemp(prefix="atom-webhook-")), [settings.host]))
        self.ca, self.cert, self.key = ca, cert, key
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._loaded = self._stamp()
        self._context.load_cert_chain(cert, key)
        self._runner: aiohttp.web.AppRunner | None = None
        self._watching: asyncio.Task[None] | None = None

    async def start(self) -> None:
        app = aiohttp.web.Application(client_max_size=MAX_REVIEW_BYTES)
        app.router.add_post(REVIEW_PATH, self._validate)
        self._runner = aiohttp.web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, self.settings.addr, self.settings.port, ssl_context=self._context)
        await site.start()
        self._watching = asyncio.create_task(self._reload_when_renewed(), name="webhook-certificate")
        log.info("event=webhook_serving addr=%s port=%d", self.settings.addr, self.settings.port)

    async def stop(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    def _stamp(self) -> tuple[float, float]:
        return Path(self.cert).stat().st_mtime, Path(self.key).stat().st_mtime

    async def _reload_when_renewed(self) -> None:
        while True:
            await asyncio.sleep(CERTIFICATE_CHECK_SECONDS)
            try:
                stamp = self._stamp()
                if stamp != self._loaded:
                    self._context.load_cert_chain(self.cert, self.key)  # new connections get the new one
                    self._loaded = stamp
                    log.info("event=webhook_certificate_reloaded")
            except (OSError, ssl.SSLError) as e:  # half-written during a renewal: next time
                log.warning("event=webhook_certificate_unreadable error=%s", e)

    async def _validate(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        text = await request.text()
        try:
            data = json.loads(text)
        except RecursionError:
            data = None
        except ValueError as e:
            return aiohttp.web.Response(status=400, text=f"not an AdmissionReview: {e}\n")
        if data is None or depth(data) > MAX_REVIEW_DEPTH:
            # Nested deeper than any valid object: refused before anything recursive (pydantic) sees it.
            uid = re.search(r'"uid"\s*:\s*"([-0-9a-fA-F]{1,64})"', text)
            refused = Verdict([f"object: must be nested at most {MAX_OBJECT_DEPTH} levels deep"])
            return aiohttp.web.json_response(answer(uid.group(1) if uid else "", refused))
        req = data.get("request") if isinstance(data, dict) else None
        if not isinstance(req, dict) or not isinstance(req.get("uid"), str):
            return aiohttp.web.Response(status=400, text="not an AdmissionReview: no request.uid\n")
        if req.get("operation") not in ("CREATE", "UPDATE"):
            return aiohttp.web.json_response(answer(req["uid"], Verdict()))
        verdict = self.review(req.get("object"), req.get("oldObject"), req.get("namespace"))
        return aiohttp.web.json_response(answer(req["uid"], verdict))


def answer(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview answering request ``uid``: allowed with warnings, or refused with 422 and the reasons."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.warnings:
        response["warnings"] = verdict.warnings
    if not verdict.allowed:
        response["status"] = {"code": 422, "message": "; ".join(verdict.refusals)}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


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


def configuration(
    client_config: dict[str, Any],
    *,
    name: str = WEBHOOK_NAME,
    namespace_selector: dict[str, Any] | None = None,
    resources: Sequence[tuple[str, str, str]] = ((GROUP, VERSION, PLURAL),),
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration for a chart or a test to apply.

    ``client_config`` is {url} or {service: {namespace, name, port, path}}, plus caBundle (base64 PEM); the
    review is served under ``/validate``.
    """
    client = dict(client_config)
    if "url" in client:
        client["url"] = client["url"].rstrip("/") + REVIEW_PATH
    elif "service" in client:
        client["service"] = {**client["service"], "path": REVIEW_PATH}
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
