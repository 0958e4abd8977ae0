"""Start and stop a real control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok.

Everything runs as local processes on 127.0.0.1 with free ports and a private work directory, so two
clusters can run side by side. Nodes are kwok fakes that advertise NPUs the way a device plugin would;
pods bound to them go Running and Ready through the stages in ``kwok-stages.yaml``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from atom_operator import npu

from atom_localcluster import pki, tools

HERE = Path(__file__).resolve().parent
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"


class HarnessError(RuntimeError):
    """A component did not come up; the message carries the tail of its log."""


@dataclass(frozen=True)
class FakeNode:
    name: str
    labels: dict[str, str]
    npus: dict[str, str]  # extended resource -> count, as a device plugin advertises it

    def manifest(self) -> dict:
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti", **self.npus}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    **self.labels,
                },
            },
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        }


def atom_node(name: str, npus: int = 4, resource: str = npu.RBLN_GENERIC_RESOURCE) -> FakeNode:
    """An ATOM node as RBLN's feature discovery labels it and its device plugin advertises it: the generic name
    ``rebellions.ai/npu`` by default (useGenericResourceName on), ``rebellions.ai/ATOM`` on a legacy cluster."""
    # Labels: RBLN-SW/rbln-npu-feature-discovery internal/collector/collector.go toPlainText (family from the
    # product: familyFromProduct, RBLN-CA* -> ATOM); see atom_operator.npu.
    return FakeNode(
        name,
        {
            npu.RBLN_PRESENT_LABEL: "true",
            npu.RBLN_COUNT_LABEL: str(npus),
            npu.RBLN_FAMILY_LABEL: "ATOM",
            npu.RBLN_PRODUCT_LABEL: "RBLN-CA22",
            "rebellions.ai/driver-version.full": "1.2.92",
            "rebellions.ai/driver-version.major": "1",
            "rebellions.ai/driver-version.minor": "2",
            "rebellions.ai/driver-version.patch": "92",
        },
        {resource: str(npus)},
    )


def legacy_atom_node(name: str, npus: int = 4) -> FakeNode:
    """An ATOM node of a cluster whose device plugin runs with generic names off: ``rebellions.ai/ATOM``."""
    return atom_node(name, npus, npu.RBLN_ATOM_RESOURCE)


def rngd_node(name: str, npus: int = 2, resource: str = npu.RNGD_RESOURCE, product: str = "rngd") -> FakeNode:
    """An RNGD node with ``npus`` cards as Furiosa's feature discovery labels it (no ``npu.present`` label exists)
    and its device plugin advertises it: ``furiosa.ai/rngd`` per card, or per partition of a card for a partition
    name such as ``furiosa.ai/rngd-2core.12gb`` (8 cores a card: resource_name.go rngdMaxCores)."""
    units = npus * npu.rngd_partitions_per_card(resource)
    # Labels: furiosa-ai/furiosa-feature-discovery src/npu.rs to_labels and src/furiosa-feature-discovery.rs
    # extract_labels (npu.count); see atom_operator.npu.
    return FakeNode(
        name,
        {
            npu.RNGD_FAMILY_LABEL: npu.RNGD_FAMILY,
            npu.RNGD_PRODUCT_LABEL: product,
            npu.RNGD_COUNT_LABEL: str(npus),
            npu.RNGD_DRIVER_LABEL: "2025.3.0",
            f"{npu.RNGD_DRIVER_LABEL}.major": "2025",
            f"{npu.RNGD_DRIVER_LABEL}.minor": "3",
            f"{npu.RNGD_DRIVER_LABEL}.patch": "0",
            f"{npu.RNGD_DRIVER_LABEL}.metadata": "",
            f"{npu.RNGD_DRIVER_LABEL}.prerelease": "",
        },
        {resource: str(units)},
    )


# A default-named cluster's ATOM nodes, one legacy-named ATOM node (tests of a cluster with generic names off
# point the operator at it), and an RNGD node.
DEFAULT_NODES = (atom_node("atom-0"), atom_node("atom-1"), legacy_atom_node("atom-legacy-0"), rngd_node("rngd-0"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # If the harness process is killed outright, its components go with it instead of lingering.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Component:
    name: str
    proc: subprocess.Popen
    log: Path

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def write_kubeconfig(path: Path, server: str, ca: Path, client: pki.KeyPair, user: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "atom-test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}],
        "contexts": [{"name": user, "context": {"cluster": "atom-test", "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    # Writes only: tests count them (e.g. "a resync with nothing changed sends no write").
    "rules": [
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "None"},
    ],
}


@dataclass(frozen=True)
class ComponentSpec:
    """One process of the control plane: its binary and its flags (``--flag=value`` each, so booleans read right)."""

    name: str
    binary: Path
    flags: dict[str, object]

    def argv(self) -> list[object]:
        return [self.binary, *(f"{flag}={value}" for flag, value in self.flags.items())]


# Every component but etcd binds to loopback and runs alone (no leader election, no profiling).
_LOCAL = {"--bind-address": "127.0.0.1", "--leader-elect": "false", "--profiling": "false"}
# Far above the default client throttle (20 QPS): with hundreds of objects (make bench-operator) the controllers
# should be limited by the API server, not by their own rate limiter.
_CLIENT_RATE = {"--kube-api-qps": 200, "--kube-api-burst": 400}


def etcd_spec(binary: Path, data_dir: Path, port: int, peer_port: int) -> ComponentSpec:
    url, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
    return ComponentSpec("etcd", binary, {
        "--name": "atom",
        "--data-dir": data_dir,
        "--listen-client-urls": url,
        "--advertise-client-urls": url,
        "--listen-peer-urls": peer,
        "--initial-advertise-peer-urls": peer,
        "--initial-cluster": f"atom={peer}",
        "--unsafe-no-fsync": "true",  # a test cluster: speed over durability
        "--log-level": "warn",
    })


def _authenticated(kubeconfig: Path) -> dict[str, object]:
    """A controller's client and its own serving endpoint, both on ``kubeconfig``'s identity."""
    return {"--kubeconfig": kubeconfig, "--authentication-kubeconfig": kubeconfig,
            "--authorization-kubeconfig": kubeconfig, "--secure-port": free_port()}


def controller_manager_spec(
    binary: Path, kubeconfig: Path, sa: pki.KeyPair, ca: pki.CertificateAuthority
) -> ComponentSpec:
    return ComponentSpec("kube-controller-manager", binary, {
        **_authenticated(kubeconfig),
        **_LOCAL,
        "--service-account-private-key-file": sa.key,
        "--root-ca-file": ca.pair.cert,
        "--use-service-account-credentials": "true",
        "--cluster-signing-cert-file": ca.pair.cert,
        "--cluster-signing-key-file": ca.pair.key,
        "--service-cluster-ip-range": SERVICE_CIDR,
        "--cluster-cidr": POD_CIDR,
        # Garbage collection and workload controllers react at once; nodes are kwok's to keep alive.
        "--concurrent-gc-syncs": 20,
        **_CLIENT_RATE,
    })


def scheduler_spec(binary: Path, kubeconfig: Path) -> ComponentSpec:
    # The client rate flags are deprecated for the scheduler, and still honoured without --config.
    return ComponentSpec("kube-scheduler", binary, {**_authenticated(kubeconfig), **_LOCAL, **_CLIENT_RATE})


def kwok_spec(binary: Path, kubeconfig: Path) -> ComponentSpec:
    return ComponentSpec("kwok", binary, {
        "--kubeconfig": kubeconfig,
        "--config": HERE / "kwok-stages.yaml",
        "--manage-all-nodes": "false",
        "--manage-nodes-with-annotation-selector": "kwok.x-k8s.io/node=fake",
        "--cidr": "10.244.0.1/16",
        "--node-ip": "10.0.0.1",
        "--node-lease-duration-seconds": 40,
        "--server-address": f"127.0.0.1:{free_port()}",
    })


@dataclass
class Cluster:
    """A running control plane. Use as a context manager, or ``start()``/``stop()``."""

    workdir: Path | None = None
    nodes: Sequence[FakeNode] = DEFAULT_NODES
    detached: bool = False  # components outlive this process (make cluster-up)
    # Where the ``kubernetes`` Service points. Loopback suits processes on this host; a real node's pods need an
    # address they can route to (atom_localcluster/realnode.py relays it to the loopback listener).
    advertise_address: str = "127.0.0.1"
    components: list[Component] = field(default_factory=list)
    _own_workdir: bool = False

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> Cluster:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="atom-cluster-"))
            self._own_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        wd = self.workdir
        assert wd is not None
        binaries = {
            b: tools.path(b) for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
        }
        self.kubectl_path = tools.kubectl()
        pkidir = wd / "pki"
        ca = pki.CertificateAuthority(pkidir)
        self.ca_file = ca.pair.cert
        self.ca = ca
        hosts = (
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.96.0.1",
            self.advertise_address,
        )
        serving = ca.issue("apiserver", "kube-apiserver", hosts=hosts, server=True)
        admin = ca.issue("admin", "atom-admin", orgs=("system:masters",), client=True)
        kcm = ca.issue("kcm", "system:kube-controller-manager", client=True)
        sched = ca.issue("scheduler", "system:kube-scheduler", client=True)
        kwok = ca.issue("kwok", "kwok-controller", orgs=("system:masters",), client=True)
        self.kubelet_client = ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", orgs=("system:masters",), client=True
        )
        sa = pki.service_account_keys(pkidir)
        self.admin_pair = admin

        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        self.kubeconfig = write_kubeconfig(wd / "kubeconfig", self.server, ca.pair.cert, admin, "admin")
        kcm_cfg = write_kubeconfig(wd / "kcm.kubeconfig", self.server, ca.pair.cert, kcm, "kcm")
        sched_cfg = write_kubeconfig(wd / "scheduler.kubeconfig", self.server, ca.pair.cert, sched, "scheduler")
        kwok_cfg = write_kubeconfig(wd / "kwok.kubeconfig", self.server, ca.pair.cert, kwok, "kwok")
        self.audit_log = wd / "audit.log"
        (wd / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        deadline = time.monotonic() + timeout

        etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd = self._spawn("etcd", etcd_spec(binaries["etcd"], wd / "etcd", etcd_port, etcd_peer).argv())
        self._wait(etcd, lambda: _http_ok(f"{etcd_url}/health"), deadline)
        self._api_inputs = (wd, ca, serving, sa, binaries, etcd_url)
        api = self._spawn("kube-apiserver", self._apiserver_argv(api_port, self.audit_log))
        self._wait(api, self._readyz, deadline)
        for spec in (
            controller_manager_spec(binaries["kube-controller-manager"], kcm_cfg, sa, ca),
            scheduler_spec(binaries["kube-scheduler"], sched_cfg),
            kwok_spec(binaries["kwok"], kwok_cfg),
        ):
            self._spawn(spec.name, spec.argv())
        self._wait_default_service_account(deadline)
        self.add_nodes(self.nodes, deadline=deadline)

    def _apiserver_argv(self, port: int, audit_log: Path) -> list[object]:
        """kube-apiserver's command line; every instance (see ``start_apiserver``) shares etcd and certificates."""
        wd, ca, serving, sa, binaries, etcd_url = self._api_inputs
        flags = {
            "--etcd-servers": etcd_url,
            "--bind-address": "127.0.0.1",
            "--advertise-address": self.advertise_address,
            "--secure-port": port,
            "--tls-cert-file": serving.cert,
            "--tls-private-key-file": serving.key,
            "--client-ca-file": ca.pair.cert,
            "--authorization-mode": "Node,RBAC",
            "--service-account-issuer": "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file": sa.cert,
            "--service-account-signing-key-file": sa.key,
            "--service-cluster-ip-range": SERVICE_CIDR,
            "--allow-privileged": "true",
            "--kubelet-preferred-address-types": "Hostname,InternalIP",
            "--kubelet-client-certificate": self.kubelet_client.cert,
            "--kubelet-client-key": self.kubelet_client.key,
            "--kubelet-certificate-authority": ca.pair.cert,
            "--audit-policy-file": wd / "audit-policy.yaml",
            "--audit-log-path": audit_log,
            "--audit-log-format": "json",
            "--profiling": "false",
        }
        return ComponentSpec("kube-apiserver", binaries["kube-apiserver"], flags).argv()

    def stop(self) -> None:
        for c in reversed(self.components):
            _terminate(c.proc)
        self.components.clear()
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- use -----------------------------------------------------------------------------------------
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120, as_user: str | None = None
    ) -> subprocess.CompletedProcess:
        cmd = [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args]
        if as_user:
            cmd += ["--as", as_user]
        out = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise subprocess.CalledProcessError(out.returncode, cmd, out.stdout, out.stderr)
        return out

    def apply(self, manifest: dict | list[dict] | str, *args: str) -> subprocess.CompletedProcess:
        text = (
            manifest
            if isinstance(manifest, str)
            else yaml.safe_dump_all(manifest if isinstance(manifest, list) else [manifest])
        )
        return self.kubectl("apply", "-f", "-", *args, input=text)

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def wait_crd_established(self, name: str, timeout: float = 60.0) -> None:
        """Poll until the CRD ``name`` is Established. Unlike ``kubectl wait``, which exits at the first error, an
        API server still settling after its start (a refused or failed read) is retried until ``timeout``."""
        deadline, last = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            left = max(deadline - time.monotonic(), 1.0)
            out = self.kubectl("get", "crd", name, "-o", "json", check=False, timeout=left)
            if out.returncode == 0:
                conditions = json.loads(out.stdout).get("status", {}).get("conditions", [])
                if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                    return
                last = f"conditions: {conditions}"
            else:
                last = out.stderr.strip()
            time.sleep(0.2)
        raise TimeoutError(f"crd/{name} not Established after {timeout:.0f}s; last: {last}")

    def add_nodes(self, nodes: Sequence[FakeNode], *, deadline: float | None = None) -> None:
        if not nodes:
            return
        manifests = [n.manifest() for n in nodes]
        self.apply(manifests)
        # Node status is also a subresource: set capacity there too, so it holds whether or not create kept it.
        for m in manifests:
            self.kubectl(
                "patch",
                "node",
                m["metadata"]["name"],
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps(
                    {"status": {"capacity": m["status"]["capacity"], "allocatable": m["status"]["allocatable"]}}
                ),
            )
        remaining = max(5.0, (deadline or time.monotonic() + 60) - time.monotonic())
        self.kubectl(
            "wait",
            "--for=condition=Ready",
            "--timeout",
            f"{int(remaining)}s",
            *[f"node/{n.name}" for n in nodes],
            timeout=remaining + 10,
        )

    def write_requests(self) -> list[dict]:
        """Every write request the API server has audited so far (one dict per request)."""
        events = []
        with contextlib.suppress(FileNotFoundError), open(self.audit_log) as f:
            for line in f:
                with contextlib.suppress(json.JSONDecodeError):
                    ev = json.loads(line)
                    if ev.get("stage") == "ResponseComplete":
                        events.append(ev)
        return events

    def component(self, name: str) -> Component:
        return next(c for c in self.components if c.name == name)

    # ---- more API servers (an HA control plane) --------------------------------------------------------
    def start_apiserver(self, name: str, port: int | None = None, timeout: float = 60.0) -> str:
        """Another kube-apiserver on the same etcd (as in an HA control plane); its URL. A client of it can lose
        its API server (``stop_component``) while the cluster stays writable through the first one. Restart it
        on the same port by calling this again with that port. Its writes are audited in ``<name>.audit.log``."""
        assert self.workdir is not None
        port = port or free_port()
        with contextlib.suppress(StopIteration):
            self.components.remove(self.component(name))
        comp = self._spawn(name, self._apiserver_argv(port, self.workdir / f"{name}.audit.log"))
        url = f"https://127.0.0.1:{port}"
        self._wait(comp, lambda: _http_ok(f"{url}/readyz", self._ssl()), time.monotonic() + timeout)
        return url

    def stop_component(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Stop one component at once (SIGKILL: as a crash or a lost machine would)."""
        comp = self.component(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(comp.proc.pid, sig)
        comp.proc.wait(30)

    # ---- internals -------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: Sequence[object]) -> Component:
        assert self.workdir is not None
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(a) for a in argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=None if self.detached else _die_with_parent,
            )
        comp = Component(name, proc, log)
        self.components.append(comp)
        return comp

    def _wait(self, comp: Component, ready, deadline: float) -> None:
        while time.monotonic() < deadline:
            if comp.proc.poll() is not None:
                raise HarnessError(f"{comp.name} exited with {comp.proc.returncode}; last log lines:\n{comp.tail()}")
            if ready():
                return
            time.sleep(0.2)
        raise HarnessError(f"{comp.name} was not ready in time; last log lines:\n{comp.tail()}")

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.admin_pair.cert), str(self.admin_pair.key))
        return ctx

    def _readyz(self) -> bool:
        return _http_ok(f"{self.server}/readyz", self._ssl())

    def _wait_default_service_account(self, deadline: float) -> None:
        # Pods in "default" are refused until the controller-manager has made its ServiceAccount.
        kcm = self.component("kube-controller-manager")
        self._wait(kcm, lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0, deadline)
        for c in self.components:
            if c.proc.poll() is not None:
                raise HarnessError(f"{c.name} exited with {c.proc.returncode}; last log lines:\n{c.tail()}")

    def state(self) -> dict:
        return {
            "workdir": str(self.workdir),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "pids": {c.name: c.proc.pid for c in self.components},
        }


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def _terminate(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def kill_pids(pids: dict[str, int]) -> None:
    """Stop a detached cluster's components by process group (make cluster-down)."""
    for pid in reversed(list(pids.values())):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    end = time.monotonic() + 10
    for pid in pids.values():
        while time.monotonic() < end and _alive(pid):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
