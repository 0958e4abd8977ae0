"""A private containerd for the real node: its own config, root, state, socket and CNI network.

Nothing here touches the machine's other runtimes: docker's containerd keeps its socket and root, ours lives under
the harness's work directory. Choices that matter on this machine:

* ``restrict_oom_score_adj = true``: root here lacks CAP_SYS_RESOURCE, so runc cannot lower a container's OOM
  score below its parent's; without this every pod sandbox fails with "can't get final child's PID from pipe".
* ``netns_mounts_under_state_dir`` and runc's ``Root`` under the state dir: pod network namespaces and runc state
  stay inside the work directory instead of /var/run/netns and /run/containerd/runc, so teardown knows them all.
* The pause image is made here (no image can be pulled): a static C program that sleeps until SIGTERM.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from atom_localcluster.images.daemon import ensure_daemon

CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin uses

# The pod sandbox's one process. It is PID 1 of the pod: reap orphans, exit on SIGTERM/SIGINT, otherwise sleep.
PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


class ContainerdError(RuntimeError):
    """containerd, ctr or an image import failed; the message carries the output."""


def pause_tag() -> str:
    return f"atom.local/pause:{hashlib.sha256(PAUSE_C.encode()).hexdigest()[:12]}"


def build_pause_image() -> str:
    """``atom.local/pause:<hash of the source>`` in docker, compiled statically and ``docker import``-ed once."""
    ensure_daemon()  # the real node's first step: a test or bench run alone on a fresh boot starts dockerd here
    tag = pause_tag()
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    if shutil.which("gcc") is None:
        raise ContainerdError("gcc is needed to build the pause image (apt-get install gcc libc6-dev)")
    with tempfile.TemporaryDirectory(prefix="atom-pause-") as tmp:
        src, exe = Path(tmp) / "pause.c", Path(tmp) / "pause"
        src.write_text(PAUSE_C)
        cc = subprocess.run(["gcc", "-Os", "-static", "-s", "-o", str(exe), str(src)], capture_output=True, text=True)
        if cc.returncode != 0:
            raise ContainerdError(f"compiling pause.c failed: {cc.stderr[-2000:]}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tar.gettarinfo(str(exe), arcname="pause")
            info.uid = info.gid = 0
            info.mode = 0o755
            with open(exe, "rb") as f:
                tar.addfile(info, f)
        imp = subprocess.run(
            ["docker", "import", "--change", 'ENTRYPOINT ["/pause"]', "-", tag],
            input=buf.getvalue(),
            capture_output=True,
        )
        if imp.returncode != 0:
            raise ContainerdError(f"docker import of {tag} failed: {imp.stderr.decode(errors='replace')[-2000:]}")
    return tag


def cni_bin_dir() -> Path:
    for d in CNI_BIN_DIRS:
        if (d / "bridge").exists():
            return d
    raise ContainerdError("no CNI plugins found: apt-get install containernetworking-plugins")


def cni_conflist(network: str, bridge: str, subnet: str, gateway: str, ipam_dir: Path) -> dict:
    """bridge + host-local + portmap, on a bridge the node owns; loopback is set up by the CRI plugin itself."""
    return {
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,  # traffic stays on this host: nothing to masquerade
                "hairpinMode": True,  # a pod reaching itself through its Service's ClusterIP
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


@dataclass
class Containerd:
    """Paths and config of one private containerd; the process itself is spawned by the caller's harness."""

    workdir: Path  # <node workdir>/containerd
    cni_conf_dir: Path
    sandbox_image: str

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def root(self) -> Path:
        return self.workdir / "root"

    @property
    def state(self) -> Path:
        return self.workdir / "state"

    @property
    def runc_root(self) -> Path:
        return self.state / "runc"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        runc = f"{cri}.containerd.runtimes.runc"
        text = f"""version = 2
root = {json.dumps(str(self.root))}
state = {json.dumps(str(self.state))}
# Only what the CRI needs; the opt plugin would write to /opt/containerd, tracing would dial out.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = {json.dumps(str(self.socket))}

[ttrpc]
  address = {json.dumps(str(self.workdir / "containerd.ttrpc.sock"))}

[{cri}]
  sandbox_image = {json.dumps(self.sandbox_image)}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{runc}]
  runtime_type = "io.containerd.runc.v2"

[{runc}.options]
  SystemdCgroup = false
  Root = {json.dumps(str(self.runc_root))}

[{cri}.cni]
  bin_dir = {json.dumps(str(cni_bin_dir()))}
  conf_dir = {json.dumps(str(self.cni_conf_dir))}
  max_conf_num = 1
"""
        path = self.workdir / "config.toml"
        path.write_text(text)
        return path

    def argv(self) -> list[str]:
        return ["containerd", "--config", str(self.workdir / "config.toml"), "--log-level", "info"]

    def ctr(self, *args: str, input: bytes | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
        cmd = ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args]
        out = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)
        if out.returncode != 0:
            raise ContainerdError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.decode(errors='replace')}")
        return out

    def import_docker_image(self, ref: str, timeout: float = 900) -> None:
        """``docker save <ref> | ctr images import -``: the image becomes usable by pods without any pull."""
        save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            imp = subprocess.run(
                ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, "images", "import", "-"],
                stdin=save.stdout,
                capture_output=True,
                timeout=timeout,
            )
        finally:
            assert save.stdout is not None
            save.stdout.close()
            save_rc = save.wait(timeout=60)
        if save_rc != 0 or imp.returncode != 0:
            err = (save.stderr.read() if save.stderr else b"") + imp.stderr
            raise ContainerdError(f"importing {ref} into containerd failed: {err.decode(errors='replace')[-2000:]}")

    def images(self) -> list[str]:
        return self.ctr("images", "list", "--quiet").stdout.decode().split()

    def containers(self) -> list[str]:
        return self.ctr("containers", "list", "--quiet").stdout.decode().split()
