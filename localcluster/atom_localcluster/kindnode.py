"""kind's node image, made here from the pinned parts: ``python -m atom_localcluster.kindnode`` (make kind-node-image).

Why assembled directly and not with ``kind build node-image --type file <release tarball>``: that command
imports only kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy from the tarball and
*pulls* every other image the node needs (etcd, CoreDNS, pause, kindnetd, the local-path provisioner) with
``ctr content fetch`` from their registries (sigs.k8s.io/kind v0.33.0, pkg/build/nodeimage/buildcontext.go,
``prePullImagesAndWriteManifests``), which cannot work offline. So this module follows the same steps itself,
from the same recipe:

* **Base** (kind images/base/Dockerfile): a Debian rootfs made by ``debootstrap`` with the Dockerfile's package
  list — systemd, conntrack, iptables, nftables, iproute2, ethtool, util-linux, mount, kmod, libseccomp2, pigz,
  e2fsprogs, bash, ca-certificates, curl, jq, procps — and, from Debian instead of kind's source builds,
  containerd, runc and the CNI plugins. kind's own files (entrypoint, systemd units, kubelet drop-ins,
  containerd config, sysctls, /kind/bin scripts) are copied from the pinned kind module (read from the Go module
  cache, never vendored) and the Dockerfile's RUN steps are replayed in the rootfs.
* **Kubernetes** (pkg/build/nodeimage ``buildImage``): kubeadm, kubelet and kubectl into /usr/bin, the version
  into /kind/version, the control-plane images pre-loaded into the node's containerd (``ctr images import
  --no-unpack`` with the pinned label, in a build container that runs containerd, then ``docker commit``).
* **Images**, each a static Go binary built from its pinned module (hack/tools) in a minimal image:
  kube-apiserver, kube-controller-manager, kube-scheduler, etcd, CoreDNS; kube-proxy with the iptables/nft
  binaries and their shared libraries staged from the node rootfs (as kind stages local-path-helper's); the
  project's static pause (atom_localcluster/containerd.py); with ``storage=True`` also kind's local-path
  provisioner and its staged helper, with kind's default-storage manifest. They are named
  ``atom.local/kind/<name>:<version>`` and kubeadm is pointed at them with ``imageRepository`` and the etcd/dns
  image tags (:func:`cluster_config`).
* **CNI**: kindnetd's Go module cannot be fetched through the module proxy here (``go list -m
  sigs.k8s.io/kindnet``: "not available"), so clusters on this image use ``disableDefaultCNI`` and the image
  carries a bridge + host-local + portmap conflist over the whole pod subnet — correct for the single-node
  cluster :func:`cluster_config` makes (every pod on one bridge), not for several nodes.

The image is cached in Docker as ``atom.local/kind-node:<kubernetes version>-<key>``; the key hashes the recipe
(the fields below, with a revision bumped when the build steps change, every pinned version, the pause source and
kind's files), so a change builds a new image and an unchanged recipe is reused at once.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from atom_localcluster import containerd, tools
from atom_localcluster.images.daemon import (
    DockerError,
    apt_install,
    cache_dir,
    docker,
    ensure_daemon,
    image_exists,
    tail,
)

REPOSITORY = "atom.local/kind"  # kubeadm's imageRepository on this image: <REPOSITORY>/<component>:<tag>
NODE_REPOSITORY = "atom.local/kind-node"
POD_SUBNET = "10.244.0.0/16"  # kind's default podSubnet for IPv4 (pkg/apis/config/v1alpha4/default.go)
CNI_CONFLIST = "/etc/cni/net.d/10-atom-bridge.conflist"
# kind images/base/Dockerfile: ENTRYPOINT, `container` (systemd reads it to know it is in one) and STOPSIGNAL
# (systemd exits on SIGRTMIN+3; SIGTERM re-executes it). `docker import --change` takes no STOPSIGNAL, so that
# one is set by a one-line build on top.
NODE_CHANGES = ("ENV container=docker", 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]')
NODE_STOPSIGNAL = "SIGRTMIN+3"
PATH_ENV = "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class NodeRecipe:
    """What goes into the node image; with the pinned versions and this module's source it names the image."""

    suite: str = "bookworm"  # systemd 252: boots on this machine's cgroup v1 hierarchy (systemd >= 256 refuses)
    variant: str = "minbase"
    # kind images/base/Dockerfile's `clean-install` list, minus the network-storage packages (nfs-common,
    # open-iscsi: storage e2e only) and fuse-overlayfs (rootless only), plus containerd, runc and the CNI plugins
    # from Debian (kind builds those from source in other stages).
    packages: tuple[str, ...] = (
        "systemd", "dbus",
        "conntrack", "iptables", "nftables", "iproute2", "ethtool", "util-linux", "mount", "kmod",
        "libseccomp2", "pigz", "e2fsprogs",
        "bash", "ca-certificates", "curl", "jq", "procps",
        "containerd", "runc", "containernetworking-plugins",
    )
    # kube-proxy's image: these binaries (and what they link) from the node rootfs, as upstream's
    # distroless-iptables image carries them.
    proxy_binaries: tuple[str, ...] = ("/usr/sbin/xtables-nft-multi", "/usr/sbin/nft", "/usr/sbin/conntrack")
    # The local-path provisioner's helper pod runs `/bin/sh /script/setup|teardown` (mkdir, rm): kind's
    # images/local-path-helper stages exactly these into a distroless image.
    helper_binaries: tuple[str, ...] = ("/bin/sh", "/bin/mkdir", "/bin/rm")
    # kind's default storage. Off by default: compiling the provisioner (its own client-go) took over 10 minutes on
    # this shared 2-core machine; without /kind/manifests/default-storage.yaml kind installs its legacy host-path
    # StorageClass instead (pkg/cluster/internal/create/actions/installstorage), and the e2e uses no volume.
    storage: bool = False
    revision: int = 1  # bump when the build steps below change in a way the fields do not show

    def versions(self) -> dict[str, str]:
        return {name: tools.toolset_of(binary).version for name, binary in
                (("kubernetes", "kubelet"), ("etcd", "etcd"), ("coredns", "coredns"), ("kind", "kind"),
                 ("local-path-provisioner", "local-path-provisioner"))}

    def key(self) -> str:
        h = hashlib.sha256(json.dumps({"recipe": asdict(self), "versions": self.versions(),
                                       "pause": containerd.pause_tag()}, sort_keys=True).encode())
        files = kind_files()
        for f in sorted(p for p in files.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(files)).encode() + b"\0" + f.read_bytes())
        return h.hexdigest()[:12]

    def tag(self) -> str:
        return f"{NODE_REPOSITORY}:{self.versions()['kubernetes']}-{self.key()}"


def _log(msg: str) -> None:
    print(f"kind-node: {msg}", file=sys.stderr, flush=True)


def kind_source() -> Path:
    """The pinned kind module's source in the Go module cache (downloaded once, like any module)."""
    version = tools.toolset_of("kind").version
    out = subprocess.run(["go", "mod", "download", "-json", f"sigs.k8s.io/kind@{version}"], capture_output=True,
                         text=True, cwd=tools.GO_MODULES / "kind")
    if out.returncode != 0:
        raise DockerError(f"go mod download sigs.k8s.io/kind@{version} failed: {out.stdout[-1000:]}{out.stderr}")
    return Path(json.loads(out.stdout)["Dir"])


def kind_files() -> Path:
    return kind_source() / "images" / "base" / "files"


def image_refs() -> dict[str, str]:
    """Component -> the reference kubeadm (with :func:`cluster_config`'s patches) and containerd use."""
    v = NodeRecipe().versions()
    refs = {c: f"{REPOSITORY}/{c}:{v['kubernetes']}"
            for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")}
    refs["etcd"] = f"{REPOSITORY}/etcd:{v['etcd']}"
    refs["coredns"] = f"{REPOSITORY}/coredns:{v['coredns']}"
    return refs


def storage_refs() -> dict[str, str]:
    """kind's default storage (a local-path provisioner and its helper), by the names this image gives them."""
    v = NodeRecipe().versions()["local-path-provisioner"]
    return {"storageProvisionerImage": f"{REPOSITORY}/local-path-provisioner:{v}",
            "storageHelperImage": f"{REPOSITORY}/local-path-helper:{v}"}


def storage_manifest() -> str:
    """kind's default-storage manifest (pkg/build/nodeimage/const_storage.go, a Go string concatenation of raw
    literals and the two image constants) with this image's provisioner and helper images."""
    source = (kind_source() / "pkg/build/nodeimage/const_storage.go").read_text()
    expr = source.split("const defaultStorageManifest = ", 1)[1]
    parts, refs = [], storage_refs()
    while True:
        expr = expr.lstrip()
        if expr.startswith("`"):
            literal, expr = expr[1:].split("`", 1)
            parts.append(literal)
        else:
            name = expr.split(None, 1)[0]
            parts.append(refs[name])  # KeyError: kind's manifest names an image this recipe does not build
            expr = expr[len(name):]
        expr = expr.lstrip()
        if not expr.startswith("+"):
            return "".join(parts)
        expr = expr[1:]


def cluster_config(nodes: int = 1) -> dict:
    """The kind Cluster config for this image: kubeadm pointed at the pre-loaded images, the bridge CNI instead
    of kindnetd (see the module doc: one node), kube-proxy in nftables mode (as the real-node tier runs it)."""
    if nodes != 1:
        raise ValueError(f"the local node image's bridge CNI serves one node; got nodes={nodes}")
    refs = image_refs()
    patch = {
        "kind": "ClusterConfiguration",
        "imageRepository": REPOSITORY,
        "etcd": {"local": {"imageTag": refs["etcd"].rpartition(":")[2]}},
        "dns": {"imageTag": refs["coredns"].rpartition(":")[2]},
    }
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "networking": {"disableDefaultCNI": True, "kubeProxyMode": "nftables", "podSubnet": POD_SUBNET},
        "kubeadmConfigPatches": [json.dumps(patch)],
        "nodes": [{"role": "control-plane"}],
    }


# --- the rootfs -------------------------------------------------------------------------------------------------


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, **kw)
    if out.returncode != 0:
        err = out.stderr if isinstance(out.stderr, str) else out.stderr.decode(errors="replace")
        raise DockerError(f"{what}: {' '.join(cmd[:4])} ... exited {out.returncode}: {err.strip()[-2000:]}")
    return out


def _copy_tree(src: Path, dst: Path, mode: int) -> None:
    for f in src.rglob("*"):
        target = dst / f.relative_to(src)
        if f.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            target.chmod(0o755)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)
            target.chmod(mode)


def _install_kind_files(rootfs: Path, files: Path, pause: str) -> None:
    """kind images/base/Dockerfile's COPY lines: scripts 0755, everything else 0644."""
    _copy_tree(files / "usr" / "local" / "bin", rootfs / "usr/local/bin", 0o755)
    _copy_tree(files / "kind", rootfs / "kind", 0o644)
    _copy_tree(files / "kind" / "bin", rootfs / "kind/bin", 0o755)
    _copy_tree(files / "etc", rootfs / "etc", 0o644)
    config = rootfs / "etc/containerd/config.toml"
    lines = config.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        key = line.split("=")[0].strip()
        if key == "sandbox_image":  # kind names the upstream pause image; the sandbox here is the project's own
            lines[i] = f'  sandbox_image = "{pause}"\n'
        elif key == "restrict_oom_score_adj":
            # Root here lacks CAP_SYS_RESOURCE (see atom_localcluster/runc_caps.py), so runc cannot lower a container's
            # OOM score below its parent's: kind's entrypoint sets this for rootless nodes, the same limit.
            lines[i] = "  restrict_oom_score_adj = true\n"
    config.write_text("".join(lines))


def _replay_dockerfile_steps(rootfs: Path) -> None:
    """kind images/base/Dockerfile's RUN steps after `clean-install`, in the rootfs."""
    for pattern in ("lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service",
                    "lib/systemd/system/multi-user.target.wants/*", "etc/systemd/system/*.wants/*",
                    "lib/systemd/system/local-fs.target.wants/*", "lib/systemd/system/sockets.target.wants/*udev*",
                    "lib/systemd/system/sockets.target.wants/*initctl*", "lib/systemd/system/basic.target.wants/*"):
        for p in rootfs.glob(pattern):
            p.unlink()
    with open(rootfs / "etc/systemd/journald.conf", "a") as f:
        f.write("ReadKMsg=no\n")
    init = rootfs / "sbin/init"
    if init.exists() or init.is_symlink():
        init.unlink()
    init.symlink_to("/usr/lib/systemd/systemd")
    _run(["chroot", str(rootfs), "systemctl", "enable", "kubelet.service", "containerd.service",
          "undo-mount-hacks.service"], "systemctl enable")
    _run(["chroot", str(rootfs), "systemctl", "mask", "systemd-binfmt.service"], "systemctl mask")
    (rootfs / "etc/kubernetes/manifests").mkdir(parents=True, exist_ok=True)
    # kind's units and scripts expect its own install paths: containerd in /usr/local/bin, CNI in /opt/cni/bin.
    for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
        link = rootfs / "usr/local/bin" / name
        if not link.exists():
            link.symlink_to(f"/usr/bin/{name}")
    (rootfs / "opt/cni").mkdir(parents=True, exist_ok=True)
    if not (rootfs / "opt/cni/bin").exists():
        (rootfs / "opt/cni/bin").symlink_to("/usr/lib/cni")
    # The Dockerfile's `ctr oci spec | jq ...`: the default spec with kind's product-files hook and no rlimits.
    spec = json.loads(_run(["chroot", str(rootfs), "ctr", "oci", "spec"], "ctr oci spec").stdout)
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append(
        {"path": "/kind/bin/mount-product-files.sh"})
    spec["process"].pop("rlimits", None)
    (rootfs / "etc/containerd/cri-base.json").write_text(json.dumps(spec, indent=2))


def _cni_conflist() -> dict:
    """One bridge for every pod of the (single) node; hairpin so a pod reaches itself through its Service."""
    return {
        "cniVersion": "1.0.0",
        "name": "atom-kind",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def _install_kubernetes(recipe: NodeRecipe, rootfs: Path) -> None:
    for binary in ("kubeadm", "kubelet", "kubectl"):
        dst = rootfs / "usr/bin" / binary
        shutil.copyfile(tools.path(binary), dst)
        dst.chmod(0o755)
    (rootfs / "kind/version").write_text(NodeRecipe().versions()["kubernetes"])
    if recipe.storage:
        (rootfs / "kind/manifests").mkdir(parents=True, exist_ok=True)
        (rootfs / "kind/manifests/default-storage.yaml").write_text(storage_manifest())
    conflist = rootfs / CNI_CONFLIST.lstrip("/")
    conflist.parent.mkdir(parents=True, exist_ok=True)
    conflist.write_text(json.dumps(_cni_conflist(), indent=2))


def _debootstrap(recipe: NodeRecipe, rootfs: Path, log: Path) -> None:
    if shutil.which("debootstrap") is None:
        apt_install("debootstrap")
    cmd = ["debootstrap", f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}", recipe.suite,
           str(rootfs)]
    _log(f"debootstrap {recipe.suite} with {len(recipe.packages)} packages (log: {log})")
    with open(log, "wb") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise DockerError(f"debootstrap exited {rc}; {log}:\n{tail(log)}")
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*", "var/log/*.log",
                    "var/log/apt/*", "usr/share/doc/*", "usr/share/man/*", "usr/share/locale/*"):
        for p in rootfs.glob(pattern):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _docker_import(rootfs: Path, tag: str, changes: tuple[str, ...]) -> None:
    # The kernel fills /proc, /sys and /dev at run time; an image carries them empty.
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "--exclude=./proc/*", "--exclude=./sys/*",
                            "--exclude=./dev/*", "-c", "."], stdout=subprocess.PIPE)
    imp = subprocess.run(["docker", "import", *[a for c in changes for a in ("--change", c)], "-", tag],
                         stdin=tar.stdout, capture_output=True, text=True)
    assert tar.stdout is not None
    tar.stdout.close()
    if tar.wait() != 0 or imp.returncode != 0:
        raise DockerError(f"docker import of {tag} failed: {imp.stderr.strip()[-2000:]}")


def _set_stopsignal(image: str, signal: str) -> None:
    _run(["docker", "build", "--tag", image, "-"], "docker build (STOPSIGNAL)",
         input=f"FROM {image}\nSTOPSIGNAL {signal}\n".encode())


# --- component images -------------------------------------------------------------------------------------------


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _add_dirs(tar: tarfile.TarFile, names: list[str]) -> None:
    done: set[str] = set()
    for name in names:
        parts = Path(name.lstrip("/")).parts[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in done:
                done.add(d)
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)


def _image_from_files(tag: str, files: dict[str, bytes], links: dict[str, str], changes: tuple[str, ...]) -> None:
    """A one-layer image holding exactly ``files`` (path -> content) and ``links`` (path -> symlink target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add_dirs(tar, [*files, *links])
        tmp = tarfile.TarInfo("tmp")  # world-writable, sticky: etcd, CoreDNS and kube-proxy may write temp files
        tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(tmp)
        for name, data in sorted(files.items()):
            _add_file(tar, name, data)
        for name, target in sorted(links.items()):
            info = tarfile.TarInfo(name.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    imp = subprocess.run(["docker", "import", *[a for c in changes for a in ("--change", c)], "-", tag],
                         input=buf.getvalue(), capture_output=True)
    if imp.returncode != 0:
        raise DockerError(f"docker import of {tag} failed: {imp.stderr.decode(errors='replace')[-2000:]}")


def _staged_libraries(rootfs: Path, binaries: tuple[str, ...]) -> dict[str, bytes]:
    """``binaries`` and every shared library they load (``ldd`` in the rootfs), read from the rootfs."""
    wanted = set(binaries)
    for binary in binaries:
        out = _run(["chroot", str(rootfs), "ldd", binary], f"ldd {binary}", text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
                wanted.add(parts[2])
            elif parts and parts[0].startswith("/"):
                wanted.add(parts[0])  # the dynamic loader
    xtables = rootfs / "usr/lib/x86_64-linux-gnu/xtables"
    files = {p: (rootfs / p.lstrip("/")).resolve().read_bytes() for p in wanted}
    if xtables.is_dir():  # iptables' match/target extensions, loaded by name at run time
        files.update({f"/{p.relative_to(rootfs)}": p.read_bytes() for p in xtables.glob("*.so")})
    return files


def _component_images(recipe: NodeRecipe, rootfs: Path) -> list[str]:
    refs = image_refs()
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
        _image_from_files(refs[name], {f"/usr/local/bin/{name}": tools.path(name).read_bytes()}, {}, (PATH_ENV,))
    _image_from_files(refs["coredns"], {"/coredns": tools.path("coredns").read_bytes()}, {},
                      (PATH_ENV, 'ENTRYPOINT ["/coredns"]'))
    proxy = _staged_libraries(rootfs, recipe.proxy_binaries)
    proxy["/usr/local/bin/kube-proxy"] = tools.path("kube-proxy").read_bytes()
    links = {f"/usr/sbin/{n}": "xtables-nft-multi" for n in (
        "iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore",
        "iptables-nft", "iptables-nft-save", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-save",
        "ip6tables-nft-restore")}
    _image_from_files(refs["kube-proxy"], proxy, links, (PATH_ENV,))
    if not recipe.storage:
        return [*refs.values(), containerd.build_pause_image()]
    storage = storage_refs()
    _image_from_files(storage["storageProvisionerImage"],
                      {"/usr/local/bin/local-path-provisioner": tools.path("local-path-provisioner").read_bytes()},
                      {}, (PATH_ENV,))
    _image_from_files(storage["storageHelperImage"], _staged_libraries(rootfs, recipe.helper_binaries), {},
                      (PATH_ENV,))
    return [*refs.values(), *storage.values(), containerd.build_pause_image()]


# --- assembling ---------------------------------------------------------------------------------------------------


def _preload(base: str, images: list[str], tag: str, work: Path) -> None:
    """pkg/build/nodeimage's way: a build container running containerd imports the images, then docker commit."""
    archive = work / "images.tar"
    _run(["docker", "save", "-o", str(archive), *images], "docker save")
    name = f"atom-kind-build-{uuid.uuid4().hex[:8]}"
    _run(["docker", "run", "-d", "--entrypoint=sleep", f"--name={name}", "--security-opt", "seccomp=unconfined",
          base, "infinity"], "docker run (build container)")
    try:
        _run(["docker", "exec", name, "bash", "-c", "nohup containerd > /tmp/containerd.log 2>&1 &"], "containerd")
        _run(["docker", "exec", name, "bash", "-c",
              "for i in $(seq 1 60); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 "
              "&& exit 0; sleep 0.5; done; cat /tmp/containerd.log; exit 1"], "waiting for containerd")
        with open(archive, "rb") as f:
            _run(["docker", "exec", "-i", name, "ctr", "--namespace=k8s.io", "images", "import",
                  "--label=io.cri-containerd.pinned=pinned", "--no-unpack", "--digests", "-"], "ctr images import",
                 stdin=f)
        listed = _run(["docker", "exec", name, "ctr", "--namespace=k8s.io", "images", "list", "-q"], "ctr images list",
                      text=True).stdout.split()
        missing = [i for i in images if not any(line == i or line.endswith("/" + i) for line in listed)]
        if missing:
            raise DockerError(f"not in the node's containerd after the import: {missing}; it has {listed}")
        # `sleep` is PID 1 here and reaps nobody: containerd is stopped once it is gone or a zombie.
        _run(["docker", "exec", name, "bash", "-c", "pkill containerd; for i in $(seq 1 120); do "
              "ps -C containerd -o stat= | grep -qv Z || exit 0; sleep 0.25; done; exit 1"], "stopping containerd")
        _run(["docker", "exec", name, "rm", "-f", "/tmp/containerd.log"], "cleanup")
        _run(["docker", "commit", *[a for c in NODE_CHANGES for a in ("--change", c)], name, tag], "docker commit")
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)


def build(recipe: NodeRecipe = NodeRecipe()) -> str:
    """The node image's tag, built unless an image with this recipe's key exists already."""
    ensure_daemon()
    tag = recipe.tag()
    if image_exists(tag):
        return tag
    if os.geteuid() != 0:
        raise DockerError("debootstrap and chroot need root to build the kind node image; set KIND_NODE_IMAGE")
    started = time.monotonic()
    _log(f"building {tag}")
    work = cache_dir() / "kind-node"
    work.mkdir(parents=True, exist_ok=True)
    for binary in ("kubeadm", "kubelet", "kubectl", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                   "kube-proxy", "etcd", "coredns", *(("local-path-provisioner",) if recipe.storage else ())):
        tools.path(binary)  # builds the pinned tool if it is missing
    with tempfile.TemporaryDirectory(prefix="build-", dir=work) as tmp:
        rootfs = Path(tmp) / "rootfs"
        _debootstrap(recipe, rootfs, work / "debootstrap.log")
        _install_kind_files(rootfs, kind_files(), containerd.pause_tag())
        _replay_dockerfile_steps(rootfs)
        _install_kubernetes(recipe, rootfs)
        images = _component_images(recipe, rootfs)
        base = f"{NODE_REPOSITORY}-base:{recipe.key()}"
        _docker_import(rootfs, base, NODE_CHANGES)
        _set_stopsignal(base, NODE_STOPSIGNAL)
        _preload(base, images, tag, Path(tmp))
        docker("rmi", base, check=False)
    _log(f"built {tag} in {time.monotonic() - started:.0f}s")
    return tag


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m atom_localcluster.kindnode", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build or reuse the node image; print its tag")
    sub.add_parser("tag", help="print the tag the current recipe builds (nothing is built)")
    sub.add_parser("config", help="print the kind cluster config for the image (JSON)")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            print(build())
        elif args.cmd == "tag":
            print(NodeRecipe().tag())
        else:
            print(json.dumps(cluster_config(), indent=2))
    except DockerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
