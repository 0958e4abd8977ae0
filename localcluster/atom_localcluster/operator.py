"""The operator as a child process (of a test session, a benchmark): started, killed and restarted on demand.

It runs out of cluster against the local cluster, with its own client certificate (user ``atom-operator``) so the
tests and benchmarks can tell its writes from their own in the API server's audit log.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from atom_operator import webhook

from atom_localcluster.cluster import free_port
from atom_localcluster.tools import REPO

USER = "atom-operator"


class OperatorProcess:
    hooks: tuple[str, ...] = ()  # modules imported into the process before the operator starts (a test's hooks)

    def __init__(self, cluster, workdir: Path, server: str | None = None) -> None:
        """``server``: the API server to talk to (default: the cluster's first)."""
        self.cluster, self.workdir, self.server = cluster, workdir, server or cluster.server
        self.kubeconfig, self.user = self._identity()
        self.ca, self.cert, self.key = webhook.make_certificates(workdir / "webhook", ["127.0.0.1"])
        self.webhook_port, self.metrics_port = free_port(), free_port()
        self.log_path = workdir / "operator.log"
        self.proc: subprocess.Popen | None = None

    def _identity(self) -> tuple[Path, str | None]:
        ca = getattr(self.cluster, "ca", None)
        if ca is None:  # an existing cluster: run as the admin and count writes by namespace only
            return Path(self.cluster.kubeconfig), None
        from atom_localcluster.cluster import write_kubeconfig

        pair = ca.issue("atom-operator", USER, orgs=("system:masters",), client=True)
        path = write_kubeconfig(
            self.workdir / "operator.kubeconfig", self.server, self.cluster.ca_file, pair, USER
        )
        return path, USER

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            **{k: v for k, v in os.environ.items() if k != "ATOM_FAILPOINT"},
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONPATH": os.pathsep.join([str(REPO / "engine"), str(REPO / "operator"), str(REPO)]),
            "ATOM_WEBHOOK_ADDR": "127.0.0.1",
            "ATOM_WEBHOOK_PORT": str(self.webhook_port),
            "ATOM_WEBHOOK_CERT": str(self.cert),
            "ATOM_WEBHOOK_KEY": str(self.key),
            "ATOM_WEBHOOK_CA": str(self.ca),
            "ATOM_METRICS_ADDR": "127.0.0.1",
            "ATOM_METRICS_PORT": str(self.metrics_port),
            "ATOM_ENGINE_IMAGE": "example.invalid/atom-engine:test",  # kwok runs no containers
            **extra,
        }
        return env

    def start(self, wait: bool = True, **env: str) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = open(self.log_path, "a")  # noqa: SIM115 - the child keeps it
        argv = [sys.executable, "-m", "atom_localcluster.operator_main", *self.hooks]
        self.proc = subprocess.Popen(
            argv, env=self.env(**env), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        if wait:
            self.wait_healthy()

    def healthy(self, probe: str = "healthz") -> bool:
        """``healthz``: alive (the liveness probe); ``readyz``: and every cache has synced (the readiness probe)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/{probe}", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 120, probe: str = "readyz") -> None:
        end = time.monotonic() + timeout
        while not self.healthy(probe):
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError("operator did not come up:\n" + self.log()[-4000:])
            time.sleep(0.2)

    def wait_exit(self, timeout: float = 120) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self, **env: str) -> None:
        self.stop()
        self.start(**env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_offset(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def wait_log(self, pattern: str, since: int = 0, timeout: float = 120) -> re.Match:
        end = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            with open(self.log_path, errors="replace") as f:
                f.seek(since)
                found = rx.search(f.read())
            if found:
                return found
            if time.monotonic() > end:
                raise AssertionError(f"operator log never matched {pattern!r}:\n" + self.log()[-3000:])
            time.sleep(0.3)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def writes(self, namespace: str) -> list[dict]:
        """The operator's audited write requests into ``namespace`` so far."""
        return [
            w
            for w in self.cluster.write_requests()
            if (w.get("objectRef") or {}).get("namespace") == namespace
            and (self.user is None or (w.get("user") or {}).get("username") == self.user)
        ]
