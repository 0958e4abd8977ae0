"""make demo: the main job on the embedded default, step by step.

Today it brings up the local control plane (etcd, kube-apiserver, controller-manager, scheduler and kwok
fake NPU nodes), shows the nodes with their NPU capacity, and tears it all down.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.__main__ import print_nodes  # noqa: E402
from tests.harness.cluster import Cluster  # noqa: E402


class Steps:
    def __init__(self, total: int) -> None:
        self.total, self.n = total, 0

    def run(self, title: str, fn: Callable[[], object]) -> object:
        self.n += 1
        print(f"[{self.n}/{self.total}] {title} ...", flush=True)
        started = time.monotonic()
        try:
            result = fn()
        except Exception as e:
            print(f"[{self.n}/{self.total}] FAILED: {title}: {e}", file=sys.stderr, flush=True)
            raise SystemExit(1) from e
        print(f"[{self.n}/{self.total}] done in {time.monotonic() - started:.1f}s", flush=True)
        return result


def main() -> int:
    steps = Steps(3)
    cluster = Cluster()
    try:
        steps.run("start the control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)", cluster.start)
        steps.run("list the nodes with their NPU capacity", lambda: print_nodes(cluster))
    finally:
        steps.run("stop the control plane and remove its files", cluster.stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
