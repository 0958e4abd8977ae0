"""Local processes beside the control plane (engines, pickers, proxies, the operator), as the demo and the routing
tests run them: each in its own session with its log in a work folder, waited for over HTTP, stopped in reverse
order (SIGTERM, then SIGKILL after a grace period)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    """Until ``url`` answers 200; fails with the log's tail when ``proc`` exits or ``timeout`` passes."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.3)
    raise RuntimeError(f"{url} was not ready in {timeout:.0f}s:\n{log.read_text()[-3000:]}")


class Processes:
    """Processes started in ``workdir`` (logs ``<name>.log``), stopped in reverse order by :meth:`stop`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.procs = workdir, []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                    start_new_session=True, cwd=self.workdir)
        self.procs.append(proc)
        return proc, log

    def stop(self) -> None:
        while self.procs:
            p = self.procs.pop()
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
