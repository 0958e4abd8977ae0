"""With ATOM_WEBHOOK=off the operator runs without an admission server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from atom_localcluster.cluster import free_port

pytestmark = pytest.mark.cluster


def test_operator_starts_and_reconciles_with_the_webhook_off(cluster, operator_process, namespace, tmp_path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "ATOM_WEBHOOK": "off",
        "ATOM_METRICS_ADDR": "127.0.0.1",
        "ATOM_METRICS_PORT": str(port),
        "ATOM_NAMESPACES": namespace,
    }
    log = tmp_path / "operator.log"
    # Watching only this test's namespace, so it never competes with the session's operator.
    argv = [sys.executable, "-m", "atom_operator.cli"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"operator exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < end, f"operator never became healthy:\n{log.read_text()[-3000:]}"
            time.sleep(0.3)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
