"""The helm chart charts/atom-operator, with the real helm binary against the harness's real API server.

One release is installed for the module (installs cost seconds on two shared cores); tests that need a
release of their own (uninstall, refused values) make one. kwok turns the operator's pod Ready without running
it, so the webhook is never called here: its namespaceSelector matches no namespace, and nothing in the
cluster waits on a webhook that cannot answer. The webhook itself is tested in tests/api.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from atom_localcluster import tools
from atom_operator import kube, routing, runtime
from atom_operator.api.crd import CRD_NAME, render
from atom_operator.children import Defaults
from atom_operator.config import Settings
from atom_operator.controller import Controller
from atom_operator.informer import Listing
from atom_operator.kube import Kube, KubeError, TransientError
from atom_operator.npu import RESOURCE_PATTERNS, NpuProfile
from atom_operator.reconcile import reconcile
from cryptography import x509
from kubernetes_asyncio.client import Configuration

from tests.generated import CHART_CRD_PATH, CRD_PATH

pytestmark = pytest.mark.cluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "atom-operator"
# No namespace carries this label: the chart's webhook is installed, but the API server never calls it.
UNCALLED = {"matchLabels": {"atom-chart-test/webhook": "never"}}
VALUES = {"webhook": {"namespaceSelector": UNCALLED}, "engine": {"image": {"repository": "example.invalid/engine"}}}
CERT_MANAGER_KINDS = {"Issuer", "Certificate"}


def helm(*args: str, kubeconfig: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(tools.path("helm")), *args]
    if kubeconfig:
        cmd += ["--kubeconfig", str(kubeconfig)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def values_file(tmp: Path, values: dict) -> str:
    path = tmp / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def render_chart(tmp: Path, namespace: str, values: dict) -> list[dict]:
    out = helm("template", "t", str(CHART), "-n", namespace, "-f", values_file(tmp, values)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@dataclass
class Release:
    name: str
    namespace: str
    fullname: str
    install_output: str
    crd_existed: bool

    @property
    def service_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"


def make_namespace(cluster, prefix: str, **labels: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    if labels:
        cluster.kubectl("label", "namespace", name, *[f"{k}={v}" for k, v in labels.items()])
    return name


@pytest.fixture(scope="module")
def release(cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """One `helm install --wait` into a namespace that enforces the restricted Pod Security profile."""
    ns = make_namespace(cluster, "chart", **{"pod-security.kubernetes.io/enforce": "restricted"})
    existed = cluster.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
    name = "atom"
    tmp = tmp_path_factory.mktemp("chart")
    out = helm(
        "install", name, str(CHART), "-n", ns, "-f", values_file(tmp, VALUES), "--wait", "--timeout", "180s",
        kubeconfig=cluster.kubeconfig,
    )  # fmt: skip
    try:
        yield Release(name, ns, "atom-atom-operator", out.stdout, existed)
    finally:
        helm("uninstall", name, "-n", ns, "--wait", "--timeout", "120s", kubeconfig=cluster.kubeconfig, check=False)
        # helm never deletes CRDs from crds/; the CRD stays, identical to crds/ (other modules apply the same file).
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# ---- the chart's files ---------------------------------------------------------------------------------------
def test_chart_crd_is_the_generated_crd() -> None:
    assert CHART_CRD_PATH.read_text() == CRD_PATH.read_text() == render(), (
        "charts/atom-operator/crds is stale: run make crds"
    )


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("certManager.enabled=true",),
        ("webhook.enabled=false",),
        ("serviceAccount.create=false", "serviceAccount.name=x"),
        ("networkPolicy.enabled=true",),
        ("monitoring.podMonitor.enabled=true", "monitoring.serviceMonitor.enabled=true",
         "monitoring.prometheusRule.enabled=true", "monitoring.dashboards.enabled=true",
         "monitoring.labels.release=prom"),
    ],
    ids=["defaults", "cert-manager", "no-webhook", "existing-service-account", "network-policy", "monitoring"],
)
def test_helm_lint_strict_passes(sets: tuple[str, ...]) -> None:
    out = helm("lint", "--strict", str(CHART), *[a for s in sets for a in ("--set", s)])
    assert "0 chart(s) failed" in out.stdout


def test_every_value_is_in_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: dict, props: dict, path: str) -> None:
        for key, value in node.items():
            assert key in props, f"{path}{key} is not in values.schema.json"
            sub = props[key]
            sub = schema["definitions"][sub["$ref"].rsplit("/", 1)[1]] if "$ref" in sub else sub
            if isinstance(value, dict) and "properties" in sub:
                walk(value, sub["properties"], f"{path}{key}.")

    walk(yaml.safe_load((CHART / "values.yaml").read_text()), schema["properties"], "")


def test_every_value_is_commented() -> None:
    """Each value has a comment right above it, or sits in a block that has one (e.g. resources.requests)."""
    documented: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    previous = ""
    missing = []
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            previous = stripped
            continue
        indent = len(line) - len(line.lstrip())
        while documented and documented[-1][0] >= indent:
            documented.pop()
        here = previous.startswith("#") or any(d for _, d in documented)
        if not stripped.endswith(":") and not here:  # a value, not a block of them
            missing.append(f"line {number}: {stripped}")
        documented.append((indent, here))
        previous = stripped
    assert not missing, f"values.yaml values without a comment: {missing}"


# ---- rendering ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "values",
    [
        {},
        {"webhook": {"enabled": False}},
        {"certManager": {"enabled": True}},
        {"networkPolicy": {"enabled": True, "apiServerPeers": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}},
        # The dashboards' ConfigMaps (monitoring.dashboards), accepted by the API server as they are.
        {"monitoring": {"dashboards": {"enabled": True, "annotations": {"grafana_folder": "ATOM"}}}},
    ],
    ids=["defaults", "no-webhook", "cert-manager", "network-policy", "dashboards"],
)
def test_rendered_manifests_are_valid_on_the_api_server(cluster, tmp_path: Path, values: dict) -> None:
    ns = make_namespace(cluster, "chart-render", **{"pod-security.kubernetes.io/warn": "restricted"})
    try:
        docs = render_chart(tmp_path, ns, merged(VALUES, values))
        # cert-manager's kinds need its CRDs, which this cluster lacks; their links are checked by the next test.
        plain = [d for d in docs if d["kind"] not in CERT_MANAGER_KINDS]
        assert {d["kind"] for d in plain} >= {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"}
        out = cluster.apply(plain, "--dry-run=server")
        assert "PodSecurity" not in out.stderr, out.stderr  # the restricted profile holds for the pod template
        assert len(out.stdout.splitlines()) == len(plain), out.stdout
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_cert_manager_mode_links_certificate_secret_and_ca_injection(tmp_path: Path) -> None:
    docs = render_chart(tmp_path, "ops", {"certManager": {"enabled": True}})
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert not any(kind == "Secret" for kind, _ in by_kind), "cert-manager writes the Secret, the chart must not"
    serving = by_kind[("Certificate", "t-atom-operator-webhook")]
    vwc = by_kind[("ValidatingWebhookConfiguration", "t-atom-operator")]
    assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "ops/t-atom-operator-webhook"
    assert "caBundle" not in vwc["webhooks"][0]["clientConfig"]
    assert "t-atom-operator-webhook.ops.svc" in serving["spec"]["dnsNames"]
    pod = by_kind[("Deployment", "t-atom-operator")]["spec"]["template"]["spec"]
    assert {"name": "webhook-tls", "secret": {"secretName": serving["spec"]["secretName"], "defaultMode": 0o440}} in (
        pod["volumes"]
    )
    issuer = serving["spec"]["issuerRef"]["name"]
    ca_issuer = by_kind[("Issuer", issuer)]
    ca_cert = by_kind[("Certificate", "t-atom-operator-ca")]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"] and ca_cert["spec"]["isCA"]


def test_engine_image_and_pull_policy_reach_the_operator(tmp_path: Path) -> None:
    docs = render_chart(
        tmp_path, "ops", {"engine": {"image": {"repository": "r.example/engine", "tag": "9", "pullPolicy": "Always"}}}
    )
    container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ATOM_ENGINE_IMAGE"] == "r.example/engine:9"
    assert env["ATOM_ENGINE_IMAGE_PULL_POLICY"] == "Always"


def test_the_npu_profile_values_reach_the_operator_as_its_one_setting(tmp_path: Path) -> None:
    def profile_of(values: dict) -> NpuProfile:
        docs = render_chart(tmp_path, "ops", values)
        container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        return Settings.from_env(env).defaults.npu

    assert profile_of({}) == NpuProfile()  # the chart's defaults are the operator's
    legacy = {"atom": {"resource": "rebellions.ai/ATOM", "nodeSelector": {"rebellions.ai/npu.present": "true"}}}
    partitioned = {
        "rngd": {"resource": "furiosa.ai/rngd-2core.12gb", "nodeSelector": {"furiosa.ai/npu.family": "rngd"}}
    }
    got = profile_of({"npu": {**legacy, **partitioned}})
    assert (got.resource("atom"), got.resource("rngd")) == ("rebellions.ai/ATOM", "furiosa.ai/rngd-2core.12gb")


def test_the_chart_ships_the_rngd_seccomp_profile_the_rngd_pods_name(tmp_path: Path) -> None:
    docs = render_chart(tmp_path, "ops", {"engine": {"rngdImage": {"repository": "r.example/rngd", "tag": "7"}}})
    shipped = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-seccomp"))
    profile = json.loads(shipped["data"]["profile.json"])
    assert profile == json.loads((CHART / "files" / "rngd-io-uring.json").read_text())
    # io_uring is what the RNGD driver needs and what the runtimes' default profiles refuse: nothing here refuses it.
    refused = {n for rule in profile["syscalls"] if rule["action"] != "SCMP_ACT_ALLOW" for n in rule["names"]}
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert not refused & {"io_uring_setup", "io_uring_enter", "io_uring_register"}
    assert {"unshare", "setns", "mount", "bpf", "keyctl", "ptrace", "userfaultfd", "kexec_load"} <= refused
    container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    config = Settings.from_env(env)
    assert config.defaults.rngd_image == "r.example/rngd:7"
    assert config.defaults.npu.seccomp("rngd") == {"type": "Localhost", "localhostProfile": "atom/rngd-io-uring.json"}
    none = render_chart(tmp_path, "ops", {"npu": {"rngd": {"seccompProfile": ""}}})
    assert not [d for d in none if d["metadata"]["name"].endswith("-seccomp")]


def test_the_schemas_resource_names_are_the_profiles() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["npu"]["properties"]
    assert {b: schema[b]["properties"]["resource"]["pattern"] for b in schema} == RESOURCE_PATTERNS


def test_webhook_values_switch_the_operators_webhook(tmp_path: Path) -> None:
    def env_of(values: dict) -> dict[str, str]:
        docs = render_chart(tmp_path, "ops", values)
        container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert Settings.from_env(env_of({})).webhook.enabled  # runtime.start serves the webhook then
    off = Settings.from_env(env_of({"webhook": {"enabled": False}})).webhook
    assert not off.enabled


def test_each_replica_names_itself_in_the_lease_by_its_pod_name(tmp_path: Path) -> None:
    """The identity survives a container restart (a leader that exits on a lost Lease takes its own Lease back at
    once) and names the pod in the audit log's User-Agent."""
    container = next(d for d in render_chart(tmp_path, "ops", {}) if d["kind"] == "Deployment")["spec"]["template"][
        "spec"]["containers"][0]  # fmt: skip
    identity = next(e for e in container["env"] if e["name"] == "ATOM_LEASE_IDENTITY")
    assert identity["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_the_replicas_prefer_different_nodes_and_the_preference_is_configurable(tmp_path: Path) -> None:
    def pod_spec(values: dict) -> tuple[dict, dict]:
        dep = next(d for d in render_chart(tmp_path, "ops", values) if d["kind"] == "Deployment")
        return dep["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["spec"]

    def spread(values: dict) -> list[dict]:
        return pod_spec(values)[1]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]

    selector, spec = pod_spec({})
    assert list(spec["affinity"]["podAntiAffinity"]) == ["preferredDuringSchedulingIgnoredDuringExecution"]  # soft
    (term,) = spread({})
    assert term["podAffinityTerm"] == {"labelSelector": {"matchLabels": selector},  # this release's operator pods
                                       "topologyKey": "kubernetes.io/hostname"}  # fmt: skip
    zone = "topology.kubernetes.io/zone"
    assert spread({"spreadReplicas": {"topologyKey": zone}})[0]["podAffinityTerm"]["topologyKey"] == zone
    assert "affinity" not in pod_spec({"spreadReplicas": {"enabled": False}})[1]
    # The user's own anti-affinity replaces the chart's; other affinity is kept beside it.
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "other"}}}
    own = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    assert pod_spec({"affinity": own})[1]["affinity"] == own
    nodes = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "a", "operator": "Exists"}]}]}}}  # fmt: skip
    both = pod_spec({"affinity": nodes})[1]["affinity"]
    assert both["nodeAffinity"] == nodes["nodeAffinity"] and len(spread({"affinity": nodes})) == 1


# ---- refused values ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("replicas=two", "at '/replicas': got string, want integer"),
        ("replicas=6", "at '/replicas': maximum"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy': value must be one of"),
        ("engine.image.pullPolicy=always", "at '/engine/image/pullPolicy': value must be one of"),
        ("webhook.failurePolicy=Maybe", "at '/webhook/failurePolicy'"),
        ("replica=1", "additional properties 'replica' not allowed"),
        ("npu.atom.resource=rebellions.ai/atom", "at '/npu/atom/resource'"),
        ("npu.rngd.resource=furiosa.ai/npu", "at '/npu/rngd/resource'"),
    ],
)
def test_wrong_value_fails_install_with_schema_message(cluster, namespace: str, value: str, message: str) -> None:
    out = helm(
        "install", "bad", str(CHART), "-n", namespace, "--set", value, kubeconfig=cluster.kubeconfig, check=False
    )
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr and message in out.stderr, out.stderr
    listed = helm("list", "-n", namespace, "-q", kubeconfig=cluster.kubeconfig).stdout.split()
    assert "bad" not in listed
    assert cluster.kubectl("get", "clusterrole", "bad-atom-operator", check=False).returncode != 0


# ---- install, upgrade, uninstall ---------------------------------------------------------------------------
def test_install_creates_an_established_crd_equal_to_crds(cluster, release: Release) -> None:
    crd = cluster.get("crd", CRD_NAME)
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    # Without a CRD before, helm created it from the chart's crds/; with one (another module's kubectl apply of
    # the same file), helm left it alone. Either way the served CRD is the generated one.
    assert crd["spec"]["versions"] == yaml.safe_load(render())["spec"]["versions"]


def test_operator_deployment_becomes_ready_under_restricted_pod_security(cluster, release: Release) -> None:
    dep = cluster.get("deployment", release.fullname, "-n", release.namespace)
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert dep["status"].get("readyReplicas") == 2
    pods = cluster.get("pods", "-n", release.namespace, "-l", "app.kubernetes.io/instance=atom")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running", "Running"]
    ready = {c["type"]: c["status"] for c in pods[0]["status"]["conditions"]}
    assert ready["Ready"] == "True"
    container = pods[0]["spec"]["containers"][0]
    # Alive (workers and informers run) is not ready (every cache listed): two probes, two endpoints.
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTP"}


def test_install_prints_next_steps(release: Release) -> None:
    assert "kubectl get atomdeployments" in release.install_output
    assert f"rollout status deployment/{release.fullname}" in release.install_output


def _webhook_tls(cluster, release: Release) -> tuple[str, dict]:
    vwc = cluster.get("validatingwebhookconfiguration", release.fullname)
    secret = cluster.get("secret", f"{release.fullname}-webhook-tls", "-n", release.namespace)
    return vwc["webhooks"][0]["clientConfig"]["caBundle"], secret["data"]


def test_webhook_configuration_trusts_the_served_certificate(cluster, release: Release) -> None:
    ca_bundle, data = _webhook_tls(cluster, release)
    assert ca_bundle == data["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(ca_bundle))
    cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
    cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    # The API server calls <service>.<namespace>.svc.
    assert f"{release.fullname}-webhook.{release.namespace}.svc" in sans
    hook = cluster.get("validatingwebhookconfiguration", release.fullname)["webhooks"][0]
    assert hook["clientConfig"]["service"] == {
        "namespace": release.namespace, "name": f"{release.fullname}-webhook", "path": "/validate", "port": 443,
    }  # fmt: skip
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 5)


def test_upgrade_keeps_the_ca_and_the_certificate(cluster, release: Release, tmp_path: Path) -> None:
    before = _webhook_tls(cluster, release)
    pod_before = cluster.get("deployment", release.fullname, "-n", release.namespace)["spec"]["template"]
    helm(
        "upgrade", release.name, str(CHART), "-n", release.namespace, "-f", values_file(tmp_path, VALUES),
        "--set", "operator.workers=2", "--wait", "--timeout", "180s", kubeconfig=cluster.kubeconfig,
    )  # fmt: skip
    dep = cluster.get("deployment", release.fullname, "-n", release.namespace)
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ATOM_RECONCILE_WORKERS"] == "2"  # the upgrade did apply
    assert _webhook_tls(cluster, release) == before
    annotation = "checksum/webhook-tls"
    assert (
        dep["spec"]["template"]["metadata"]["annotations"][annotation]
        == pod_before["metadata"]["annotations"][annotation]
    )


def test_uninstall_removes_cluster_scoped_objects(cluster, tmp_path: Path) -> None:
    ns = make_namespace(cluster, "chart-uninstall")
    try:
        helm(
            "install", "gone", str(CHART), "-n", ns, "-f", values_file(tmp_path, VALUES), kubeconfig=cluster.kubeconfig
        )
        names = ["clusterrole/gone-atom-operator", "clusterrolebinding/gone-atom-operator",
                 "validatingwebhookconfiguration/gone-atom-operator"]  # fmt: skip
        cluster.kubectl("get", *names)
        helm("uninstall", "gone", "-n", ns, "--wait", "--timeout", "120s", kubeconfig=cluster.kubeconfig)
        for name in names:
            assert "NotFound" in cluster.kubectl("get", name, check=False).stderr, name
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# ---- RBAC --------------------------------------------------------------------------------------------------
def can_i(cluster, release: Release, verb: str, resource: str, *scope: str) -> bool:
    out = cluster.kubectl("auth", "can-i", verb, resource, *scope, "--as", release.service_account, check=False)
    assert out.stdout.strip() in ("yes", "no"), out.stderr
    return out.stdout.strip() == "yes"


@pytest.mark.parametrize("scope", [("-n", "default"), ("-n", "kube-system"), ("--all-namespaces",)])
@pytest.mark.parametrize("verb", ["get", "list", "watch", "create", "update", "patch", "delete"])
def test_service_account_cannot_touch_secrets(cluster, release: Release, verb: str, scope: tuple[str, ...]) -> None:
    assert not can_i(cluster, release, verb, "secrets", *scope)


def test_service_account_holds_the_lease_in_its_own_namespace_only(cluster, release: Release) -> None:
    for verb in ("get", "create", "update"):
        assert can_i(cluster, release, verb, "leases.coordination.k8s.io", "-n", release.namespace), verb
    assert not can_i(cluster, release, "update", "leases.coordination.k8s.io", "-n", "default")
    assert not can_i(cluster, release, "delete", "leases.coordination.k8s.io", "-n", release.namespace)


def test_replicas_elect_a_leader_and_keep_one_through_a_drain(tmp_path: Path) -> None:
    docs = render_chart(tmp_path, "ops", VALUES)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    lease = Settings.from_env(env).lease
    assert lease is not None and (lease.namespace, lease.name) == ("ops", "t-atom-operator")
    budget = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    alone = render_chart(tmp_path, "ops", merged(VALUES, {"replicas": 1}))
    assert not [d for d in alone if d["kind"] == "PodDisruptionBudget"]


def test_service_account_cannot_read_its_own_webhook_secret(cluster, release: Release) -> None:
    secret = f"secrets/{release.fullname}-webhook-tls"
    assert not can_i(cluster, release, "get", secret, "-n", release.namespace)


def needed_permissions() -> set[tuple[str, str]]:
    """(verb, resource) the operator's code needs, read from the code: its informers and the reconciler's client
    (the Lease, in the release's namespace only, is checked on its own)."""
    needs: set[tuple[str, str]] = set()
    # The informers (list, then watch): the controller's and the webhook's.
    for kind in [k for k, _, _ in runtime.WATCHED] + [k for k, _ in runtime.WEBHOOK_WATCHED]:
        group, _, plural = kube.KINDS[kind]
        needs |= {(verb, f"{plural}.{group}" if group else plural) for verb in ("list", "watch")}
    for kind, (group, _, plural) in kube.KINDS.items():
        qualified = f"{plural}.{group}" if group else plural
        if kind in ("Node", "PersistentVolumeClaim", "Lease"):
            continue  # read through the informers only; the Lease lives in the release's namespace
        if kind in routing.OPTIONAL_KINDS:
            continue  # their CRDs are not in this cluster, so can-i cannot resolve them: checked on the rendered role
        if kind == "AtomDeployment":
            needs.add(("patch", f"{qualified}/status"))  # Kube.patch_status
        elif kind == "Event":
            needs.add(("create", qualified))  # Kube.create
        elif kind == "Pod":
            needs.add(("get", qualified))
        else:  # children: Kube.get, .apply (server-side apply: patch, and create when it makes the object), .delete
            needs |= {(v, qualified) for v in ("get", "patch", "create", "delete")}
    return needs


def test_cluster_role_grants_the_optional_routing_kinds(tmp_path: Path) -> None:
    """spec.routing.inferencePool's InferencePool and HTTPRoute, whose CRDs may be missing: read from the role."""
    role = next(o for o in render_chart(tmp_path, "atom-system", {}) if o and o["kind"] == "ClusterRole")
    for kind in routing.OPTIONAL_KINDS:
        group, _, plural = kube.KINDS[kind]
        verbs = {v for r in role["rules"] if group in r.get("apiGroups", []) and plural in r.get("resources", [])
                 for v in r["verbs"]}
        assert {"get", "create", "patch", "delete"} <= verbs, f"{kind}: {sorted(verbs)}"


def test_service_account_can_do_what_the_operator_needs(cluster, release: Release) -> None:
    needs = needed_permissions()
    assert ("patch", "atomdeployments.serving.atom.dev/status") in needs and ("watch", "nodes") in needs
    refused = []
    for verb, resource in sorted(needs):
        resource, _, sub = resource.partition("/")
        args = (verb, resource, *(("--subresource", sub) if sub else ()), "--all-namespaces")
        if not can_i(cluster, release, *args):
            refused.append(f"{verb} {resource}{'/' + sub if sub else ''}")
    assert not refused, f"the chart's ClusterRole lacks: {refused}"


@pytest.mark.parametrize(
    ("verb", "resource"),
    [
        ("update", "atomdeployments.serving.atom.dev"),  # the spec is the user's
        ("delete", "atomdeployments.serving.atom.dev"),
        ("create", "pods"),  # Deployments make pods, not the operator
        ("delete", "pods"),
        ("patch", "nodes"),
        ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io"),  # the chart installs it
        ("list", "namespaces"),  # --all-namespaces watches cluster-wide, not per namespace
        ("create", "clusterroles.rbac.authorization.k8s.io"),
    ],
)
def test_service_account_cannot_do_more(cluster, release: Release, verb: str, resource: str) -> None:
    assert not can_i(cluster, release, verb, resource, "--all-namespaces")


async def reconcile_until_done(client: Kube, body: dict, defaults: Defaults) -> None:
    """One reconcile, from stores filled by listing the namespace as the informers do; a conflict with the
    session's operator (tests/operator), reconciling the same object, is retried a bounded number of times, as the
    operator itself would."""
    controller = Controller(client, defaults, workers=0)
    namespace = body["metadata"]["namespace"]
    for _ in range(5):
        for kind, owner_of, selector in runtime.WATCHED:
            items, version = await client.list(kind, namespace, selector)
            mine = [(item, key) for item in items if (key := owner_of(item)) is not None]
            controller.relisted(Listing(kind, namespace, mine, version))
        try:
            await reconcile(controller.context, body)
            return
        except TransientError:
            continue
    raise AssertionError("reconcile kept conflicting")


async def test_operator_reconciles_as_the_service_account(cluster, release: Release, namespace: str) -> None:
    """Not only can-i: the operator's own reconcile, through its own client, logged in as the chart's
    ServiceAccount, creates every child, posts Events, writes status and removes a dropped role."""
    token = cluster.kubectl("create", "token", release.fullname, "-n", release.namespace).stdout.strip()
    login = Configuration(
        host=cluster.server, api_key={"BearerToken": token}, api_key_prefix={"BearerToken": "Bearer"}
    )
    login.ssl_ca_cert = str(cluster.ca_file) if cluster.ca_file else None
    cpu = {"backend": "cpu", "npusPerReplica": 0}
    spec = {
        "model": {"source": "builtin:tiny"},
        "decode": {**cpu, "localPrefill": False},
        "prefill": {**cpu, "replicas": 1},
    }
    ad = {"apiVersion": "serving.atom.dev/v1alpha1", "kind": "AtomDeployment",
          "metadata": {"name": "x", "namespace": namespace}, "spec": spec}  # fmt: skip
    cluster.apply(ad)  # as the admin: the user's write
    defaults = Defaults(image="example.invalid/atom-engine:test")
    client = Kube(login)
    try:
        await reconcile_until_done(client, cluster.get("atomdeployment", "x", "-n", namespace), defaults)
        assert cluster.get("deployment", "x-prefill", "-n", namespace)["spec"]["replicas"] == 1
        assert cluster.get("atomdeployment", "x", "-n", namespace)["status"]["observedGeneration"] == 1
        events = cluster.get("events", "-n", namespace, "--field-selector", "involvedObject.name=x")["items"]
        assert events, "no Event was posted"

        cluster.apply({**ad, "spec": {**spec, "decode": {**cpu, "localPrefill": True}, "prefill": {"replicas": 0}}})
        await reconcile_until_done(client, cluster.get("atomdeployment", "x", "-n", namespace), defaults)
        gone = cluster.kubectl("get", "deployment", "x-prefill", "-n", namespace, check=False)
        assert "NotFound" in gone.stderr

        with pytest.raises(KubeError) as refused:
            await client.request("GET", f"/api/v1/namespaces/{release.namespace}/secrets")
        assert refused.value.status == 403
    finally:
        await client.close()


def test_network_policy_option_admits_only_the_webhook_and_metrics_ports(tmp_path: Path) -> None:
    peers = [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    values = merged(VALUES, {"networkPolicy": {"enabled": True, "apiServerPeers": peers}})
    docs = render_chart(tmp_path, "atom-system", values)
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = {r["ports"][0]["port"]: r for r in policy["spec"]["ingress"]}
    assert set(rules) == {"webhook", "metrics"} and rules["webhook"]["from"] == peers
    env = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "ATOM_NETWORK_POLICY", "value": "true"} in env
    assert not [d for d in render_chart(tmp_path, "atom-system", VALUES) if d["kind"] == "NetworkPolicy"]
