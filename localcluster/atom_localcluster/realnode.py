"""A control plane plus one real node on this machine: containerd, kubelet and kube-proxy, all private.

``RealNodeCluster`` is a :class:`~atom_localcluster.cluster.Cluster` whose pods really run. The node is named
``localhost``: the API server reaches its kubelet on 127.0.0.1 (``--kubelet-preferred-address-types`` puts
Hostname first), with a client certificate the kubelet checks against the cluster CA (anonymous access off).

What the node owns, and teardown removes even after a crash (:class:`NodeResources` records it all):

* a Linux bridge ``atombr<n>`` with gateway ``10.244.<n>.1/24`` (the pods' subnet, inside the cluster CIDR), and two
  FORWARD accept rules for it (docker's FORWARD policy is DROP, and br_netfilter sends bridged pod-to-pod traffic
  through it);
* containerd's root, state, socket, pod network namespaces and runc state under ``<workdir>/node``;
* the kubelet's cgroups under ``/atom-<n>`` in every cgroup hierarchy (``cgroupRoot``), so every container
  process can be found and killed through them;
* kube-proxy's nftables tables ``ip kube-proxy`` / ``ip6 kube-proxy`` (nftables mode: its own tables, nothing
  interleaved with docker's iptables rules);
* the kubelet's device-plugin sockets and checkpoint in ``/var/lib/kubelet/device-plugins``, and the fake-device
  plugin's device nodes under ``<workdir>/node/npu``.

kube-proxy's table name and the kubelet's device-plugin directory are fixed (the kubelet takes the directory from
``pluginapi.KubeletSocket``, whatever its ``--root-dir``), so only one real node runs on a machine at a time: a lock
file serializes them.

The node's NPUs come from a device plugin, as on a real cluster: :mod:`atom_device_plugin` registers
``rebellions.ai/npu`` with the kubelet and lists ``npus`` fake devices, and the kubelet's device manager advertises
them and hands each container its ``/dev/rbln<N>`` and ``/dev/rsd0``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from atom_device_plugin import stubs

from atom_localcluster import tools
from atom_localcluster.cluster import POD_CIDR, Cluster, HarnessError, _terminate, free_port, write_kubeconfig
from atom_localcluster.containerd import Containerd, ContainerdError, build_pause_image, cni_conflist

NODE_NAME = "localhost"
NPU_LABELS = {
    "rebellions.ai/npu.present": "true",
    "rebellions.ai/npu.family": "ATOM",
    "rebellions.ai/npu.product": "RBLN-CA22",
}
NPU_RESOURCE = "rebellions.ai/npu"  # the RBLN device plugin's default (generic names on; atom_operator.npu)
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # k8s.io/kubelet deviceplugin/v1beta1 DevicePluginPath
KUBELET_CHECKPOINT = "kubelet_internal_checkpoint"  # devicemanager/types.go kubeletDeviceManagerCheckpoint
LOCK_FILE = Path(os.environ.get("ATOM_CACHE_DIR", Path.home() / ".cache" / "atom")) / "realnode.lock"
CNI_CACHE = Path("/var/lib/cni/results")  # libcni caches ADD results here whatever the conf dir
SHIM_SOCKETS = Path("/run/containerd/s")  # containerd 1.6 puts shim sockets here, named by a hash (see below)
NODE_COMPONENTS = ("kube-proxy", "kubelet", "device-plugin", "nodegw", "containerd")


@dataclass
class NodeResources:
    """Everything the node made on the host, by name, so teardown (in-process or ``make cluster-down``) finds it."""

    index: int  # n in atombr<n>, 10.244.<n>.0/24, /atom-<n>
    workdir: str
    kube_proxy: bool

    @property
    def bridge(self) -> str:
        return f"atombr{self.index}"

    @property
    def network(self) -> str:
        return f"atom-node-{self.index}"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.244.{self.index}.0/24")

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def cgroup(self) -> str:
        return f"atom-{self.index}"

    @property
    def rule_comment(self) -> str:
        return f"atom-realnode-{self.index}"

    @property
    def socket(self) -> str:
        return str(Path(self.workdir) / "containerd" / "containerd.sock")

    @property
    def device_plugin_endpoint(self) -> str:
        """The plugin's socket in the kubelet's device-plugin directory: named by the node, so it is ours alone."""
        return f"atom-fake-npu-{self.index}.sock"


@dataclass
class RealNodeCluster(Cluster):
    """The control plane (with or without kwok's fake nodes) and the real node ``localhost``."""

    npus: int = 4
    kube_proxy: bool = True
    lock_timeout: float = 600.0
    images: tuple[str, ...] = ()  # docker images imported into the node's containerd at start
    resources: NodeResources | None = None
    containerd: Containerd | None = field(default=None, repr=False)
    _lock_fd: int | None = None

    # ---- start ---------------------------------------------------------------------------------------------
    def _start(self, timeout: float) -> None:
        assert self.workdir is not None
        self._lock()
        self.resources = NodeResources(_free_index(), str(self.workdir / "node"), self.kube_proxy)
        node_dir = Path(self.resources.workdir)
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "resources.json").write_text(json.dumps(asdict(self.resources)))
        _make_bridge(self.resources)
        self.advertise_address = self.resources.gateway
        pause = build_pause_image()  # before the control plane: a cold build must not eat its deadline
        stubs.api()  # the device plugin's gRPC stubs, likewise (generated once per machine)
        super()._start(timeout)
        deadline = time.monotonic() + max(timeout, 120.0)
        self._start_containerd(pause, deadline)
        for ref in self.images:
            self.import_image(ref)
        self._start_nodegw(deadline)
        self._start_kubelet(deadline)
        self.start_device_plugin(deadline)
        if self.kube_proxy:
            self._start_kube_proxy(deadline)

    def _start_containerd(self, pause: str, deadline: float) -> None:
        res = self.resources
        assert res is not None
        node_dir = Path(res.workdir)
        cni_dir = node_dir / "cni" / "net.d"
        cni_dir.mkdir(parents=True, exist_ok=True)
        conf = cni_conflist(res.network, res.bridge, str(res.subnet), res.gateway, node_dir / "cni" / "ipam")
        (cni_dir / "10-atom.conflist").write_text(json.dumps(conf, indent=2))
        self.containerd = Containerd(node_dir / "containerd", cni_dir, pause)
        self.containerd.write_config()
        comp = self._spawn("containerd", self.containerd.argv())
        self._wait(comp, self._containerd_answers, deadline)
        self.import_image(pause)

    def _containerd_answers(self) -> bool:
        assert self.containerd is not None
        if not self.containerd.socket.exists():
            return False
        try:
            self.containerd.ctr("version", timeout=5)
        except (ContainerdError, subprocess.TimeoutExpired):
            return False
        return True

    def import_image(self, ref: str) -> None:
        """Make a docker image usable by pods on the node (they must not pull: use IfNotPresent or Never)."""
        assert self.containerd is not None
        self.containerd.import_docker_image(ref)

    def _start_nodegw(self, deadline: float) -> None:
        res = self.resources
        assert res is not None
        api_port = self.server.rsplit(":", 1)[1]
        comp = self._spawn(
            "nodegw",
            # Run as a script (the standard library and the kubernetes client are all it needs): any directory does.
            [sys.executable, Path(__file__).with_name("nodegw.py"), "--listen", res.gateway, "--api-port", api_port,
             "--kubeconfig", self.kubeconfig],
        )
        self._wait(comp, lambda: "nodegw ready" in comp.log.read_text(errors="replace"), deadline)

    def _start_kubelet(self, deadline: float) -> None:
        res = self.resources
        assert res is not None and self.containerd is not None
        node_dir = Path(res.workdir)
        pkidir = node_dir / "pki"
        pkidir.mkdir(exist_ok=True)
        serving = self.ca.issue("kubelet-serving", NODE_NAME, hosts=(NODE_NAME, "127.0.0.1"), server=True)
        client = self.ca.issue("kubelet-client", f"system:node:{NODE_NAME}", orgs=("system:nodes",), client=True)
        kubeconfig = write_kubeconfig(node_dir / "kubelet.kubeconfig", self.server, self.ca.pair.cert, client, "node")
        _make_cgroup_root(res.cgroup)
        self.kubelet_port = free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            # The API server's kubelet-client certificate is signed by the cluster CA: the only way in.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.ca.pair.cert)},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{res.cgroup}",
            "failSwapOn": False,
            "containerRuntimeEndpoint": self.containerd.endpoint,
            "clusterDNS": [res.gateway],
            "clusterDomain": "cluster.local",
            "resolvConf": "",  # pods get the cluster DNS only, not this host's resolvers
            "registerNode": True,
            # A shared test machine: its disk is often fuller than the kubelet's defaults like. Never evict or
            # garbage-collect the images imported for the tests (they cannot be pulled back).
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "maxPods": 30,
            "shutdownGracePeriod": "0s",
        }
        (node_dir / "kubelet.yaml").write_text(yaml.safe_dump(config))
        root = node_dir / "kubelet"
        comp = self._spawn(
            "kubelet",
            [
                tools.path("kubelet"),
                "--config", node_dir / "kubelet.yaml",
                "--kubeconfig", kubeconfig,
                "--root-dir", root,
                "--cert-dir", root / "pki",
                "--hostname-override", NODE_NAME,
                "--node-ip", res.gateway,
                "--node-labels", ",".join(f"{k}={v}" for k, v in NPU_LABELS.items()),
                "--v", "1",
            ],
        )
        self._wait(comp, self._node_ready, deadline)

    def _node_ready(self) -> bool:
        out = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conds = json.loads(out.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def start_device_plugin(self, deadline: float | None = None) -> None:
        """Run the fake-device plugin; returns once the kubelet advertises its ``npus`` devices as allocatable."""
        res = self.resources
        assert res is not None
        comp = self._spawn(
            "device-plugin",
            [sys.executable, "-m", "atom_device_plugin", "--resource-name", NPU_RESOURCE, "--devices", self.npus,
             "--device-dir", Path(res.workdir) / "npu", "--plugin-dir", DEVICE_PLUGIN_DIR,
             "--endpoint", res.device_plugin_endpoint],
        )
        self._wait(comp, lambda: self.node_npus("allocatable") == self.npus, deadline or time.monotonic() + 120)

    def stop_device_plugin(self) -> None:
        """Stop the plugin (SIGTERM, as a DaemonSet pod's end): the kubelet then drops the NPUs from allocatable."""
        for c in [c for c in self.components if c.name == "device-plugin"]:
            _terminate(c.proc)
            self.components.remove(c)

    def node_npus(self, field: str = "allocatable") -> int | None:
        """The node's ``status.<field>`` of the NPU resource (None while the kubelet reports none)."""
        out = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if out.returncode != 0:
            return None
        value = json.loads(out.stdout)["status"].get(field, {}).get(NPU_RESOURCE)
        return None if value is None else int(value)

    def _start_kube_proxy(self, deadline: float) -> None:
        res = self.resources
        assert res is not None
        node_dir = Path(res.workdir)
        client = self.ca.issue("kube-proxy", "system:kube-proxy", client=True)  # bound to system:node-proxier
        kubeconfig = write_kubeconfig(node_dir / "kube-proxy.kubeconfig", self.server, self.ca.pair.cert, client,
                                      "kube-proxy")
        healthz = free_port()
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{healthz}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "clusterCIDR": POD_CIDR,
            "detectLocalMode": "ClusterCIDR",
            # No NodePort anywhere but the node bridge; leave the host's conntrack settings alone.
            "nodePortAddresses": [f"{res.gateway}/32"],
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        (node_dir / "kube-proxy.yaml").write_text(yaml.safe_dump(config))
        comp = self._spawn("kube-proxy", [tools.path("kube-proxy"), "--config", node_dir / "kube-proxy.yaml"])
        self._wait(comp, lambda: _nft_has_table("kube-proxy") and _http_200(f"http://127.0.0.1:{healthz}/healthz"),
                   deadline)

    # ---- stop ----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        for name in NODE_COMPONENTS:  # kubelet first, so nothing restarts what teardown removes
            for c in [c for c in self.components if c.name == name]:
                if name == "containerd":
                    self._remove_containers()
                _terminate(c.proc)
                self.components.remove(c)
        if self.resources is not None:
            teardown(self.resources)
        super().stop()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _remove_containers(self) -> None:
        # Through containerd while it runs, so shims exit on their own and remove their sockets.
        if self.containerd is None:
            return
        with contextlib.suppress(ContainerdError, subprocess.TimeoutExpired):
            for cid in self.containerd.containers():
                with contextlib.suppress(ContainerdError, subprocess.TimeoutExpired):
                    self.containerd.ctr("tasks", "kill", "--signal", "SIGKILL", cid, timeout=10)
                with contextlib.suppress(ContainerdError, subprocess.TimeoutExpired):
                    self.containerd.ctr("tasks", "delete", "--force", cid, timeout=20)
                with contextlib.suppress(ContainerdError, subprocess.TimeoutExpired):
                    self.containerd.ctr("containers", "delete", cid, timeout=20)

    def state(self) -> dict:
        return {**super().state(), "realnode": asdict(self.resources) if self.resources else None}

    def tails(self, lines: int = 30) -> str:
        """The last log lines of the node's components, for failure messages."""
        return "\n".join(
            f"--- {c.name} ---\n{c.tail(lines)}" for c in self.components if c.name in NODE_COMPONENTS
        )

    # ---- internals -----------------------------------------------------------------------------------------
    def _lock(self) -> None:
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        end = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    os.close(fd)
                    raise HarnessError(
                        f"another real node runs on this machine (lock {LOCK_FILE} held for "
                        f"{self.lock_timeout:.0f}s); kube-proxy's nftables table and the kubelet's device-plugin "
                        "directory are machine-wide, so they cannot share them: stop the other one "
                        "(make cluster-down) or wait for its test run to end"
                    ) from None
                time.sleep(1)
        self._lock_fd = fd


# ---- host resources ----------------------------------------------------------------------------------------
def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()}")
    return out


def _free_index() -> int:
    """The first n in 100..199 whose subnet and bridge nothing on this host uses (another harness may run)."""
    routes = _run("ip", "-j", "route", "show").stdout
    used = {ipaddress.ip_network(r["dst"], strict=False) for r in json.loads(routes) if r["dst"] != "default"}
    links = {link["ifname"] for link in json.loads(_run("ip", "-j", "link", "show").stdout)}
    for n in range(100, 200):
        net = ipaddress.IPv4Network(f"10.244.{n}.0/24")
        if f"atombr{n}" not in links and not any(net.overlaps(u) for u in used if u.version == 4):
            return n
    raise HarnessError("no free 10.244.<n>.0/24 (n in 100..199) for the node bridge")


def _make_bridge(res: NodeResources) -> None:
    # Made before the API server starts: it advertises the gateway address, and nodegw listens on it.
    _run("ip", "link", "add", res.bridge, "type", "bridge")
    _run("ip", "addr", "add", f"{res.gateway}/{res.subnet.prefixlen}", "dev", res.bridge)
    _run("ip", "link", "set", res.bridge, "up")
    for direction in ("-i", "-o"):
        _run("iptables", "-I", "FORWARD", direction, res.bridge, "-m", "comment", "--comment", res.rule_comment,
             "-j", "ACCEPT")


def _cgroup_mounts() -> list[Path]:
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mnt, fstype, *_ = line.split()
        if fstype in ("cgroup", "cgroup2"):
            out.append(Path(mnt))
    return out


def _make_cgroup_root(name: str) -> None:
    for mnt in _cgroup_mounts():
        d = mnt / name
        d.mkdir(exist_ok=True)
        if (mnt / "cpuset.cpus").exists():  # a new cpuset is empty: no task could join it
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((mnt / f).read_text())


def _cgroup_pids(name: str) -> set[int]:
    pids: set[int] = set()
    for mnt in _cgroup_mounts():
        root = mnt / name
        if root.is_dir():
            for procs in root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in procs.read_text().split())
    return pids


def _nft_has_table(name: str, family: str = "ip") -> bool:
    return _run("nft", "list", "table", family, name, check=False).returncode == 0


def _http_200(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _shims(socket: str) -> dict[int, str]:
    """pid -> id of every containerd-shim serving our containerd (their command line names its socket)."""
    out: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if args and args[0].endswith("containerd-shim-runc-v2") and socket in args and "-id" in args:
            out[int(proc.name)] = args[args.index("-id") + 1]
    return out


def _shim_socket(socket: str, shim_id: str, namespace: str = "k8s.io") -> Path:
    # containerd 1.6 runtime/v2/shim/util_unix.go SocketAddress: sha256 of <grpc address>/<namespace>/<id>.
    digest = hashlib.sha256(os.path.join(socket, namespace, shim_id).encode()).hexdigest()
    return SHIM_SOCKETS / digest


def _mounts_under(root: str) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mnt = line.split()[4].replace("\\040", " ")
        if mnt == root or mnt.startswith(root.rstrip("/") + "/"):
            out.append(mnt)
    return out


def leftovers(res: NodeResources) -> list[str]:
    """What of the node is still on the host: empty after a complete teardown (the node tests assert it)."""
    found = [f"shim pid {pid} ({sid})" for pid, sid in _shims(res.socket).items()]
    found += [f"process {pid} in cgroup /{res.cgroup}" for pid in _cgroup_pids(res.cgroup)]
    found += [f"mount {m}" for m in _mounts_under(res.workdir)]
    found += [f"cgroup {m / res.cgroup}" for m in _cgroup_mounts() if (m / res.cgroup).exists()]
    links = json.loads(_run("ip", "-j", "link", "show").stdout)
    found += [f"link {link['ifname']}" for link in links
              if link["ifname"] == res.bridge or link.get("master") == res.bridge]
    routes = json.loads(_run("ip", "-j", "route", "show").stdout)
    found += [f"route {r['dst']}" for r in routes if r["dst"] == str(res.subnet)]
    rules = _run("iptables", "-S", "FORWARD").stdout
    found += [f"iptables rule {r}" for r in rules.splitlines() if res.rule_comment in r]
    if res.kube_proxy:
        found += [f"nftables table {fam} kube-proxy" for fam in ("ip", "ip6") if _nft_has_table("kube-proxy", fam)]
    if CNI_CACHE.is_dir():
        found += [f"cni cache {p}" for p in CNI_CACHE.glob(f"{res.network}-*")]
    # Only the plugin socket is named by the node: kubelet.sock and the checkpoint belong to whichever real node
    # holds the lock now (teardown removes them while it still holds it).
    if (DEVICE_PLUGIN_DIR / res.device_plugin_endpoint).exists():
        found.append(f"device plugin socket {DEVICE_PLUGIN_DIR / res.device_plugin_endpoint}")
    if Path(res.workdir).exists():
        found.append(f"directory {res.workdir}")
    return found


def teardown(res: NodeResources) -> None:
    """Remove everything the node made, whatever state it was left in (processes may already be gone)."""
    shims = _shims(res.socket)
    # Every container process lives in the node's cgroups: kill them all, then their shims.
    for _ in range(3):
        pids = _cgroup_pids(res.cgroup) | set(shims)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        shims = {**shims, **_shims(res.socket)}
    for shim_id in set(shims.values()):
        with contextlib.suppress(FileNotFoundError):
            _shim_socket(res.socket, shim_id).unlink()
    # Deepest first: pod volumes (tmpfs), rootfs overlays, shm, network namespace bind mounts.
    for mnt in sorted(_mounts_under(res.workdir), key=lambda m: m.count("/"), reverse=True):
        if _run("umount", mnt, check=False).returncode != 0:
            _run("umount", "-l", mnt, check=False)
    for mnt in _cgroup_mounts():
        root = mnt / res.cgroup
        if root.is_dir():
            for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
    if res.kube_proxy:
        for family in ("ip", "ip6"):
            if _nft_has_table("kube-proxy", family):
                _run("nft", "delete", "table", family, "kube-proxy", check=False)
    for direction in ("-i", "-o"):
        rule = ("FORWARD", direction, res.bridge, "-m", "comment", "--comment", res.rule_comment, "-j", "ACCEPT")
        while _run("iptables", "-D", *rule, check=False).returncode == 0:
            pass
    links = json.loads(_run("ip", "-j", "link", "show").stdout)
    for link in links:  # veths whose pod namespace is gone vanish by themselves; any left are removed here
        if link.get("master") == res.bridge:
            _run("ip", "link", "del", link["ifname"], check=False)
    _run("ip", "link", "del", res.bridge, check=False)
    if CNI_CACHE.is_dir():
        for p in CNI_CACHE.glob(f"{res.network}-*"):
            p.unlink(missing_ok=True)
    _remove_device_plugin_files(res)
    _rmtree(Path(res.workdir))


def _remove_device_plugin_files(res: NodeResources) -> None:
    # The kubelet's registration socket and device checkpoint, and our plugin's socket (a plugin that died by
    # SIGKILL leaves it). The directories go too when nothing else is in them: a machine without a kubelet of its
    # own had no /var/lib/kubelet before the node.
    for name in ("kubelet.sock", KUBELET_CHECKPOINT, res.device_plugin_endpoint):
        (DEVICE_PLUGIN_DIR / name).unlink(missing_ok=True)
    for d in (DEVICE_PLUGIN_DIR, DEVICE_PLUGIN_DIR.parent):
        with contextlib.suppress(OSError):
            d.rmdir()


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
