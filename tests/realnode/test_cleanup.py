"""Teardown of a real node leaves nothing on the host, even when its kubelet and containerd died mid-flight.

This file sorts before the others on purpose: it starts a node of its own, which must not overlap the session's
(``real_node``), since only one kube-proxy may own the machine's nftables table at a time.
"""

from __future__ import annotations

import os
import signal

import pytest
from atom_localcluster.containerd import pause_tag
from atom_localcluster.realnode import NODE_NAME, RealNodeCluster, leftovers

from tests.realnode.kube import wait_for

pytestmark = pytest.mark.realnode


def test_teardown_after_a_crash_removes_every_container_mount_interface_and_file() -> None:
    node = RealNodeCluster(nodes=())
    node.start()
    try:
        res = node.resources
        assert res is not None
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper", "namespace": "default"},
            "spec": {
                "containers": [{"name": "sleep", "image": pause_tag(), "imagePullPolicy": "Never"}],
                "terminationGracePeriodSeconds": 1,
            },
        }
        node.apply(pod)

        def running() -> bool:
            phase = node.get("pod", "sleeper", "-n", "default")["status"].get("phase")
            return phase == "Running"

        wait_for(running, 120, "pod default/sleeper Running", node)
        # While it runs, the node holds all it is meant to clean up; the check below is not vacuous.
        held = leftovers(res)
        for kind in ("shim pid", "process", "mount", "cgroup", f"link {res.bridge}", "iptables rule", "nftables",
                     "device plugin socket", "directory"):
            assert any(item.startswith(kind) for item in held), f"{kind} missing from {held}"
        assert node.get("pod", "sleeper", "-n", "default")["spec"]["nodeName"] == NODE_NAME

        # A crash: kubelet, device plugin and containerd die without a chance to clean up; shims and containers
        # live on, and so do the plugin's socket and the kubelet's in /var/lib/kubelet/device-plugins.
        for name in ("kubelet", "device-plugin", "containerd"):
            os.killpg(node.component(name).proc.pid, signal.SIGKILL)
            node.component(name).proc.wait(10)
    finally:
        node.stop()
    assert leftovers(res) == []
