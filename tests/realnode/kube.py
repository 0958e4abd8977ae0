"""Small helpers for the real-node tests: bounded waits that explain themselves, and kubectl port-forward."""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from atom_localcluster.cluster import Cluster
from atom_localcluster.containerd import ContainerdError

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float, what: str, cluster: Cluster | None = None) -> T:
    """Poll ``probe`` until it returns something truthy; on timeout fail naming ``what`` with the node's logs."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        # Transient: a container listed a moment ago may be gone when asked about it; the next poll decides.
        except (subprocess.CalledProcessError, OSError, ContainerdError) as e:
            last = e
        else:
            if last:
                return last  # type: ignore[return-value]
        time.sleep(1)
    detail = getattr(last, "stderr", None) or last
    tails = cluster.tails() if cluster is not None and hasattr(cluster, "tails") else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {detail!r}\n{tails}")


@contextlib.contextmanager
def port_forward(cluster: Cluster, namespace: str, target: str, remote: int, timeout: float = 60) -> Iterator[int]:
    """``kubectl port-forward <target> :<remote>`` on 127.0.0.1; yields the local port kubectl picked."""
    cmd = [str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), "port-forward", "-n", namespace,
           "--address", "127.0.0.1", target, f":{remote}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"kubectl port-forward {target} exited {proc.wait()}: {''.join(seen)}")
            seen.append(line)
            m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
            if m:
                # Keep reading: kubectl logs a line per connection, and a full pipe would stall it.
                threading.Thread(target=proc.stdout.read, daemon=True).start()
                yield int(m.group(1))
                return
        raise AssertionError(f"kubectl port-forward {target} did not start in {timeout:.0f}s: {''.join(seen)}")
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
