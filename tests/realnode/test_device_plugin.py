"""The real node's NPUs come from a device plugin, as on an ATOM cluster: the kubelet's device manager advertises
what the plugin lists, picks devices for each container and gives it the nodes the plugin's Allocate names.

The file sorts before test_e2e on purpose: it needs all four devices free, and it leaves the plugin running again.
"""

from __future__ import annotations

import json
import re

import pytest
from atom_localcluster.realnode import DEVICE_PLUGIN_DIR, KUBELET_CHECKPOINT, NODE_NAME, NPU_RESOURCE, RealNodeCluster

from tests.realnode.kube import wait_for

pytestmark = pytest.mark.realnode

ALL = {f"/dev/rbln{i}" for i in range(4)}
# Inside the container: every NPU device node it got, its type and numbers, and proof it may read and write it
# (the device cgroup allows what the DeviceSpec's permissions say); then sleep until deleted.
PROBE = r"""
import glob, os, stat, time
for path in sorted(glob.glob('/dev/rbln*')) + sorted(glob.glob('/dev/rsd*')):
    st = os.stat(path)
    with open(path, 'r+b', buffering=0) as f:
        f.write(b'x')
        f.read(1)
    kind = 'c' if stat.S_ISCHR(st.st_mode) else 'other'
    print('device', path, kind, f'{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}', 'rw', flush=True)
print('probe done', flush=True)
while True:
    time.sleep(3600)
"""


def npu_pod(name: str, image: str, npus: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{
                "name": "probe",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["python3", "-c", PROBE],
                "resources": {"limits": {NPU_RESOURCE: str(npus)}},
            }],
            "terminationGracePeriodSeconds": 1,
        },
    }


def devices_seen(node: RealNodeCluster, namespace: str, pod: str) -> dict[str, str] | None:
    """path -> "c 1:3 rw" from the pod's log, once its probe finished (None before)."""
    out = node.kubectl("logs", "-n", namespace, pod, check=False)
    if out.returncode != 0 or "probe done" not in out.stdout:
        return None
    return {m.group(1): m.group(2) for m in re.finditer(r"^device (\S+) (.+)$", out.stdout, re.M)}


def free_npus(node: RealNodeCluster) -> int:
    """Allocatable NPUs minus what the node's pods that still exist request."""
    allocatable = node.node_npus("allocatable") or 0
    pods = node.get("pods", "-A", "--field-selector", f"spec.nodeName={NODE_NAME}")["items"]
    held = sum(
        int(c.get("resources", {}).get("limits", {}).get(NPU_RESOURCE, 0))
        for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")
        for c in p["spec"]["containers"]
    )
    return allocatable - held


def test_capacity_and_allocatable_come_from_the_plugin(real_node: RealNodeCluster) -> None:
    status = real_node.get("node", NODE_NAME)["status"]
    assert status["capacity"][NPU_RESOURCE] == "4" and status["allocatable"][NPU_RESOURCE] == "4"
    assert "rebellions.ai/ATOM" not in status["capacity"]  # the generic name only, as the RBLN plugin v0.4.0+
    # The kubelet's device manager holds the plugin's devices by ID (it checkpoints what ListAndWatch sent):
    # nothing patched the node, the kubelet advertises what it was told.
    checkpoint = json.loads((DEVICE_PLUGIN_DIR / KUBELET_CHECKPOINT).read_text())
    assert sorted(checkpoint["Data"]["RegisteredDevices"][NPU_RESOURCE]) == ["rbln0", "rbln1", "rbln2", "rbln3"]
    log = real_node.component("device-plugin").log.read_text()
    assert f"event=registered resource={NPU_RESOURCE}" in log


def test_two_pods_get_disjoint_devices_and_a_fifth_request_stays_pending(
    real_node: RealNodeCluster, namespace: str, base_image: str
) -> None:
    wait_for(lambda: free_npus(real_node) == 4, 120, "all 4 NPUs free on the node", real_node)
    try:
        for name in ("a", "b"):
            real_node.apply(npu_pod(name, base_image, 2), "-n", namespace)
        seen = {name: wait_for(lambda n=name: devices_seen(real_node, namespace, n), 120,
                               f"pod {name} to list its devices", real_node) for name in ("a", "b")}
        rbln = {name: {p for p in devices if p.startswith("/dev/rbln")} for name, devices in seen.items()}
        assert len(rbln["a"]) == 2 and len(rbln["b"]) == 2, seen
        assert not rbln["a"] & rbln["b"], f"both pods got {rbln['a'] & rbln['b']}"
        assert rbln["a"] | rbln["b"] == ALL
        for devices in seen.values():
            assert "/dev/rsd0" in devices, devices
            # The plugin's harmless nodes (the numbers of /dev/null), readable and writable in the container.
            assert set(devices.values()) == {"c 1:3 rw"}, devices

        real_node.apply(npu_pod("c", base_image, 1), "-n", namespace)

        def unschedulable() -> str | None:
            pod = real_node.get("pod", "c", "-n", namespace)
            cond = next((c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"), None)
            if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
                return cond.get("message", "")
            return None

        message = wait_for(unschedulable, 60, "pod c to be Unschedulable", real_node)
        assert f"Insufficient {NPU_RESOURCE}" in message, message
        events = real_node.get("events", "-n", namespace, "--field-selector",
                               "involvedObject.name=c,reason=FailedScheduling")["items"]
        assert any(f"Insufficient {NPU_RESOURCE}" in e["message"] for e in events), events
        assert real_node.get("pod", "c", "-n", namespace)["status"]["phase"] == "Pending"

        # Freeing a's devices lets c run, on one of them.
        real_node.kubectl("delete", "pod", "a", "-n", namespace, "--wait=true", "--timeout=60s")
        got = wait_for(lambda: devices_seen(real_node, namespace, "c"), 120, "pod c to list its device", real_node)
        assert {p for p in got if p.startswith("/dev/rbln")} <= rbln["a"], got
    finally:
        real_node.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)


def test_the_kubelet_drops_allocatable_when_the_plugin_stops(real_node: RealNodeCluster) -> None:
    real_node.stop_device_plugin()
    try:
        wait_for(lambda: real_node.node_npus("allocatable") == 0, 60, f"allocatable {NPU_RESOURCE} 0", real_node)
        # The kubelet keeps the devices in capacity, unhealthy, for its 5-minute grace (devicemanager/types.go
        # endpointStopGracePeriod) and forgets them after; allocatable is what the scheduler uses.
        assert real_node.node_npus("capacity") == 4
    finally:
        real_node.start_device_plugin()  # registers again: the session's later tests need the NPUs
    assert real_node.node_npus("allocatable") == 4
