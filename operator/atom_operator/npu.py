"""The cluster NPU profile: which extended resource each NPU backend's pods request, and which node labels they select.

Vendors' device plugins and feature discovery decide both, per cluster, so the operator is told (one setting,
``ATOM_NPU_PROFILE``; the chart's ``npu`` value) instead of guessing. The defaults are what a cluster gets from the
vendors' own installers today. Every name below was read in the vendors' public code:

Rebellions ATOM
  - resource: RBLN-SW/k8s-device-plugin ``pkg/consts/consts.go`` (GenericResourceName = "rebellions.ai/npu",
    AtomResourceName = "rebellions.ai/ATOM", VFResourceNamePrefix = "rebellions.ai/npu-vf") and
    ``cmd/rbln-device-plugin/inventory.go`` resourceNameForProduct: with ``useGenericResourceName`` every device is
    ``rebellions.ai/npu``; without it RBLN-CA* products are ``rebellions.ai/ATOM``. The plugin's chart
    (``deployments/helm/rbln-device-plugin/values.yaml``) and the RBLN NPU operator turn the option on by default
    (v0.4.0+). SR-IOV virtual functions are always ``rebellions.ai/npu-vf<N>`` (inventory.go resourceForDevice).
  - labels: RBLN-SW/rbln-npu-feature-discovery ``internal/collector/collector.go`` toPlainText: always
    ``rebellions.ai/npu.present=true|false``; with devices ``npu.count``, ``npu.product`` (the card name, e.g.
    RBLN-CA22), ``npu.family`` (familyFromProduct: RBLN-CA* -> ATOM, RBLN-CR* -> REBEL; the NPU operator's own
    NodeFeatureRule writes it lower-case, ``atom``, so the default selector leaves family out), ``driver-version.*``.
Furiosa RNGD
  - resource: furiosa-ai/furiosa-device-plugin ``internal/device_manager/resource_name.go`` (and its
    ``resource_name_test.go``): the generic strategy advertises ``furiosa.ai/rngd``, partitioning strategies
    ``furiosa.ai/rngd-1core.6gb``, ``rngd-2core.12gb``, ``rngd-4core.24gb`` (cores x 48 GB / 8 cores).
  - labels: furiosa-ai/furiosa-feature-discovery ``src/npu.rs`` to_labels: ``furiosa.ai/npu.family`` (``rngd`` for
    rngd, rngd-s and rngd-max), ``furiosa.ai/npu.product`` (the arch: rngd, rngd-s, rngd-max as furiosa-smi-go's
    Arch.ToString spells them), ``furiosa.ai/driver.version`` (+ ``.major``/``.minor``/``.patch``/``.metadata``/
    ``.prerelease``); ``src/furiosa-feature-discovery.rs`` extract_labels adds ``furiosa.ai/npu.count``. There is
    no ``furiosa.ai/npu.present``: RNGD nodes are selected by their family.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

if TYPE_CHECKING:
    from atom_operator.api.spec import AtomDeploymentSpec, DecodeSpec, PrefillSpec

# Rebellions: the device plugin's names (pkg/consts/consts.go), then feature discovery's labels (collector.go).
RBLN_GENERIC_RESOURCE, RBLN_ATOM_RESOURCE = "rebellions.ai/npu", "rebellions.ai/ATOM"
RBLN_LABELS = "rebellions.ai/npu."
RBLN_PRESENT_LABEL, RBLN_COUNT_LABEL = RBLN_LABELS + "present", RBLN_LABELS + "count"
RBLN_FAMILY_LABEL, RBLN_PRODUCT_LABEL = RBLN_LABELS + "family", RBLN_LABELS + "product"

# Furiosa: the device plugin's names (resource_name.go), then feature discovery's labels (npu.rs).
RNGD_RESOURCE = "furiosa.ai/rngd"
RNGD_PARTITION_RESOURCES = tuple(f"{RNGD_RESOURCE}-{cores}core.{cores * 6}gb" for cores in (1, 2, 4))  # 6 GB/core
RNGD_LABELS = "furiosa.ai/npu."
RNGD_FAMILY_LABEL, RNGD_PRODUCT_LABEL, RNGD_COUNT_LABEL = (RNGD_LABELS + k for k in ("family", "product", "count"))
RNGD_DRIVER_LABEL = "furiosa.ai/driver.version"
RNGD_CORES = 8  # per card (resource_name.go rngdMaxCores)


def rngd_partitions_per_card(resource: str) -> int:
    """How many of ``resource`` one RNGD card gives: 1 whole card, or 8 / the partition's cores."""
    if resource == RNGD_RESOURCE:
        return 1
    return RNGD_CORES // int(resource.removeprefix(RNGD_RESOURCE + "-").split("core")[0])


def rngd_pes(resource: str, devices: int) -> int | None:
    """The PEs an rngd pod's engine fuses into its one device (its ``rngd_pes`` setting): None for whole cards (the
    engine fuses the 8 PEs of each card it is given), a partition's cores for one partition. Partitions of a card
    are the device plugin's split of it: a pod given two may hold parts of two cards, which furiosa-torch cannot fuse
    into one device, so a partitioned pod takes exactly one."""
    if resource == RNGD_RESOURCE:
        return None
    if devices != 1:
        raise ValueError(f"rngd pods request {resource}, a partition of an RNGD card: npusPerReplica must be 1 (the"
                         f" engine fuses one partition's cores into its device); got {devices}; for more PEs use a"
                         " larger partition or whole cards (the operator's NPU profile, npu.rngd.resource)")
    return RNGD_CORES // rngd_partitions_per_card(resource)


RNGD_FAMILY, RNGD_PRODUCTS = "rngd", ("rngd", "rngd-s", "rngd-max")

# The names each backend may be configured with: what the vendors' plugins can advertise, nothing else, so a typo
# fails at `helm install` / operator start instead of leaving every pod Pending.
RESOURCE_PATTERNS = {
    "atom": r"^rebellions\.ai/(npu|ATOM|npu-vf[0-9]+)$",
    "rngd": "^" + "|".join(r.replace(".", "\\.") for r in (RNGD_RESOURCE, *RNGD_PARTITION_RESOURCES)).join("()") + "$",
}
# Every resource the vendors advertise lives under these domains: the webhook counts them all, so it can tell a
# user whose cluster advertises another naming scheme than the profile's which name it does advertise.
VENDOR_DOMAINS = ("rebellions.ai", "furiosa.ai")

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")


class _Profile(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class VendorProfile(_Profile):
    resource: str = Field(description="Extended resource the pods request (limits), as the device plugin names it.")
    node_selector: dict[str, str] = Field(
        description="Node labels the pods require, as the vendor's feature discovery writes them; merged over the"
        " AtomDeployment's own nodeSelector."
    )

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for k, v in value.items():
            if len(k) > 317 or not _LABEL_KEY.match(k):
                raise ValueError(f"{k!r} is not a label key")
            if not _LABEL_VALUE.match(v):
                raise ValueError(f"the value of {k!r} must be a label value (at most 63 characters); got {v!r}")
        return value


class AtomProfile(VendorProfile):
    resource: str = Field(RBLN_GENERIC_RESOURCE, pattern=RESOURCE_PATTERNS["atom"])
    node_selector: dict[str, str] = Field(default_factory=lambda: {RBLN_PRESENT_LABEL: "true"})


# Furiosa's RNGD driver talks to the card through io_uring (issue 17), which container runtimes' default seccomp
# profiles block; RNGD pods run under a Localhost profile that allows it (charts/atom-operator/files/), installed
# on the RNGD nodes under the kubelet's seccomp root (/var/lib/kubelet/seccomp/<this path>).
RNGD_SECCOMP_PROFILE = "atom/rngd-io-uring.json"
SECCOMP_PATH_PATTERN = r"^([A-Za-z0-9_-][A-Za-z0-9._-]*)(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"


class RngdProfile(VendorProfile):
    resource: str = Field(RNGD_RESOURCE, pattern=RESOURCE_PATTERNS["rngd"])
    node_selector: dict[str, str] = Field(default_factory=lambda: {RNGD_FAMILY_LABEL: RNGD_FAMILY})
    seccomp_profile: str = Field(
        RNGD_SECCOMP_PROFILE,
        max_length=1024,
        pattern=SECCOMP_PATH_PATTERN + "|^$",
        description="The Localhost seccomp profile of RNGD pods (allows io_uring), relative to the kubelet's seccomp"
        " root; empty: the runtime's default (only where it allows io_uring).",
    )

    def seccomp(self) -> dict[str, str]:
        """The pod's seccompProfile: Localhost keeps the restricted Pod Security profile satisfied."""
        if not self.seccomp_profile:
            return {"type": "RuntimeDefault"}
        return {"type": "Localhost", "localhostProfile": self.seccomp_profile}


class NpuProfile(_Profile):
    """Per NPU backend: the resource name and node selector of this cluster."""

    atom: AtomProfile = Field(default_factory=AtomProfile)
    rngd: RngdProfile = Field(default_factory=RngdProfile)

    def of(self, backend: str) -> VendorProfile | None:
        """The backend's profile; None for cpu (no NPU, any node)."""
        return {"atom": self.atom, "rngd": self.rngd}.get(backend)

    def resource(self, backend: str) -> str | None:
        vendor = self.of(backend)
        return vendor.resource if vendor else None

    def node_selector(self, backend: str) -> dict[str, str]:
        vendor = self.of(backend)
        return dict(vendor.node_selector) if vendor else {}

    def rngd_pes(self, backend: str, devices: int) -> int | None:
        """The engine's ``rngd_pes`` for a pod of ``backend`` given ``devices`` of this cluster's rngd resource."""
        return rngd_pes(self.rngd.resource, devices) if backend == "rngd" else None

    def seccomp(self, backend: str) -> dict[str, str]:
        """The seccompProfile of the backend's pods: RuntimeDefault, but RNGD's driver needs io_uring."""
        return self.rngd.seccomp() if backend == "rngd" else {"type": "RuntimeDefault"}

    @classmethod
    def parse(cls, text: str | None, *, source: str = "ATOM_NPU_PROFILE") -> NpuProfile:
        """The profile from its JSON text (empty: the defaults); a bad one raises ValueError naming the field."""
        if not text:
            return cls()
        try:
            return cls.model_validate(json.loads(text))
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: not JSON: {e}") from e
        except ValidationError as e:
            problems = "; ".join(
                f"{source}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}; got {err.get('input')!r}"
                for err in e.errors()
            )
            raise ValueError(problems) from e

    def dump(self) -> str:
        return json.dumps(self.model_dump(by_alias=True), sort_keys=True)


DEFAULT_PROFILE = NpuProfile()


def fusion_refusals(spec: AtomDeploymentSpec, profile: NpuProfile = DEFAULT_PROFILE) -> list[str]:
    """Why an rngd role cannot have one furiosa device from what its pods request (:func:`rngd_pes`), if so."""
    out = []
    for name, role in (("decode", spec.decode), ("prefill", spec.prefill)):
        if role.backend == "rngd" and role.replicas:
            try:
                rngd_pes(profile.rngd.resource, role.npus_per_replica)
            except ValueError as e:
                out.append(f"spec.{name}.npusPerReplica: {e}")
    return out


def npus_requested(role: DecodeSpec | PrefillSpec, profile: NpuProfile = DEFAULT_PROFILE) -> int:
    """NPUs one pod of ``role`` requests (its container's limit of the backend's resource): npusPerReplica on an
    NPU backend, none on cpu. The one count the pod template, the cluster-fit check (:func:`npu_demand`) and the
    autoscaler's NPU budget use."""
    return role.npus_per_replica if profile.resource(role.backend) else 0


def npu_demand(spec: AtomDeploymentSpec, profile: NpuProfile = DEFAULT_PROFILE) -> dict[str, int]:
    """Extended resource name -> NPUs all replicas of both roles request together, under this cluster's names."""
    demand: dict[str, int] = {}
    for role in (spec.decode, spec.prefill):
        resource, npus = profile.resource(role.backend), npus_requested(role, profile)
        if resource and role.replicas and npus:
            demand[resource] = demand.get(resource, 0) + role.replicas * npus
    return demand


def vendor_resources(allocatable: Mapping[str, Any]) -> dict[str, int]:
    """The vendors' extended resources of one node's ``status.allocatable`` (extended resources are whole numbers)."""
    out = {}
    for resource, value in allocatable.items():
        domain = resource.split("/", 1)[0]
        if "/" not in resource or not any(domain == d or domain.endswith("." + d) for d in VENDOR_DOMAINS):
            continue
        try:
            out[resource] = int(str(value))
        except ValueError:
            continue
    return out
