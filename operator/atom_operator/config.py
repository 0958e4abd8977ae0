"""The operator's settings: read from the environment once, at start-up, into one object (the chart sets each).

Environment:
  ATOM_ENGINE_IMAGE, ATOM_ENGINE_IMAGE_PULL_POLICY  what spec.image / spec.imagePullPolicy default to.
  ATOM_ENGINE_RNGD_IMAGE   the image of rngd pods (Dockerfile target engine-rngd), unless prefill.image is set.
  ATOM_NPU_PROFILE         this cluster's NPU resource names and node selectors, as JSON (the chart's `npu` value;
                           see atom_operator.npu); unset: the vendors' defaults (rebellions.ai/npu, furiosa.ai/rngd).
  ATOM_NETWORK_POLICY      true: every AtomDeployment gets NetworkPolicies (children/networkpolicy.py).
  ATOM_EPP_IMAGE           the endpoint picker of spec.routing.inferencePool (GIE's epp, hack/tools/epp's version).
  ATOM_RECONCILE_WORKERS   AtomDeployments reconciled at once (default 16; a worker mostly waits on the API
                           server, so this bounds the operator's requests in flight, not its CPU).
  ATOM_METRICS_ADDR/PORT   where /metrics, /healthz and /readyz are served (default 0.0.0.0:8080; port 0: not
                           served).
  ATOM_RESYNC_SECONDS      the longest an informer goes without a complete listing (default 300): a deletion or
                           edit no watch event reported is repaired within it. Every broken watch lists at once.
  ATOM_NAMESPACES          comma-separated namespaces to reconcile in (default: every namespace).
  ATOM_LEASE_NAMESPACE     where the leader-election Lease lives (the chart: the release's namespace); unset: no
                           election, this process reconciles alone (run one only).
  ATOM_LEASE_NAME          the Lease's name (default atom-operator; the chart: the release's name).
  ATOM_LEASE_IDENTITY      this replica's name in the Lease (the chart: the pod's name; default: host name and a
                           random suffix). A restart under the same identity takes its own Lease back at once.
  ATOM_WEBHOOK            "off" disables the webhook server (the CRD's CEL rules still refuse invalid specs).
  ATOM_WEBHOOK_ADDR/PORT  where to listen (default 0.0.0.0:9443).
  ATOM_WEBHOOK_HOST       the host name the API server calls (default: the listening address).
  ATOM_WEBHOOK_CERT/KEY   the serving certificate and key, read again when they change; ATOM_WEBHOOK_CA the CA that
                          signed them. Without them a CA and certificate are generated. The chart installs the
                          ValidatingWebhookConfiguration (see webhook.configuration).

The Kubernetes credentials are not settings: the client finds them as every client does (the service account in
the cluster, else KUBECONFIG).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from atom_operator.children import Defaults
from atom_operator.lease import LeaseSettings
from atom_operator.npu import NpuProfile


@dataclass(frozen=True)
class WebhookSettings:
    enabled: bool = True
    addr: str = "0.0.0.0"
    port: int = 9443
    host: str = "127.0.0.1"
    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WebhookSettings:
        addr = env.get("ATOM_WEBHOOK_ADDR", "0.0.0.0")
        return cls(
            enabled=env.get("ATOM_WEBHOOK", "on") != "off",
            addr=addr,
            port=int(env.get("ATOM_WEBHOOK_PORT", "9443")),
            host=env.get("ATOM_WEBHOOK_HOST") or (addr if addr != "0.0.0.0" else "127.0.0.1"),
            cert=env.get("ATOM_WEBHOOK_CERT") or None,
            key=env.get("ATOM_WEBHOOK_KEY") or None,
            ca=env.get("ATOM_WEBHOOK_CA") or None,
        )


@dataclass(frozen=True)
class Settings:
    defaults: Defaults = field(default_factory=Defaults)
    workers: int = 16
    metrics_addr: str = "0.0.0.0"
    metrics_port: int = 8080
    resync_seconds: int = 300
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    lease: LeaseSettings | None = None  # None: no leader election

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """``env``: the process environment unless given (the tests hand in the chart's rendered one)."""
        env = os.environ if env is None else env
        base = Defaults()
        return cls(
            defaults=Defaults(
                image=env.get("ATOM_ENGINE_IMAGE") or base.image,
                image_pull_policy=env.get("ATOM_ENGINE_IMAGE_PULL_POLICY") or base.image_pull_policy,
                rngd_image=env.get("ATOM_ENGINE_RNGD_IMAGE") or base.rngd_image,
                npu=NpuProfile.parse(env.get("ATOM_NPU_PROFILE")),
                network_policy=env.get("ATOM_NETWORK_POLICY", "").lower() in ("1", "true", "yes"),
                epp_image=env.get("ATOM_EPP_IMAGE") or base.epp_image,
            ),
            workers=int(env.get("ATOM_RECONCILE_WORKERS", "16")),
            metrics_addr=env.get("ATOM_METRICS_ADDR", "0.0.0.0"),
            metrics_port=int(env.get("ATOM_METRICS_PORT", "8080")),
            resync_seconds=int(env.get("ATOM_RESYNC_SECONDS", "300")),
            namespaces=tuple(n.strip() for n in env.get("ATOM_NAMESPACES", "").split(",") if n.strip()),
            webhook=WebhookSettings.from_env(env),
            lease=LeaseSettings(
                namespace=env["ATOM_LEASE_NAMESPACE"],
                name=env.get("ATOM_LEASE_NAME") or "atom-operator",
                identity=env.get("ATOM_LEASE_IDENTITY") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
            )
            if env.get("ATOM_LEASE_NAMESPACE")
            else None,
        )
