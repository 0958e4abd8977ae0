"""make cluster-up / cluster-down / demo: the harness for humans.

``up`` starts a cluster whose components outlive this command and records them in a state file (``--real-node``
adds the real node ``localhost``, see atom_localcluster/realnode.py, beside kwok's fake nodes);
``down`` stops them and removes the work directory; ``nodes`` prints the nodes with their NPU capacity.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from atom_localcluster.cluster import Cluster, HarnessError, kill_pids

STATE_DIR = Path(os.environ.get("ATOM_CLUSTER_DIR") or Path.home() / ".cache" / "atom" / "cluster")
# The NPU resources under both ATOM naming schemes and RNGD's, and the labels the vendors' feature discovery writes.
NODE_COLUMNS = ",".join(
    (
        "NAME:.metadata.name",
        "READY:.status.conditions[?(@.type=='Ready')].status",
        "rebellions.ai/npu:.status.allocatable.rebellions\\.ai/npu",
        "rebellions.ai/ATOM:.status.allocatable.rebellions\\.ai/ATOM",
        "furiosa.ai/rngd:.status.allocatable.furiosa\\.ai/rngd",
    )
)
LABEL_COLUMNS = (
    "rebellions.ai/npu.present",
    "rebellions.ai/npu.family",
    "rebellions.ai/npu.product",
    "rebellions.ai/npu.count",
    "furiosa.ai/npu.family",
    "furiosa.ai/npu.product",
    "furiosa.ai/npu.count",
)


def print_nodes(cluster: Cluster) -> None:
    print(cluster.kubectl("get", "nodes", "-o", f"custom-columns={NODE_COLUMNS}").stdout, end="")
    # Every vendor label under its full name (kubectl get -L would cut the domain off), as the scheduler matches it.
    labels = [label + ":.metadata.labels." + label.replace(".", "\\.") for label in LABEL_COLUMNS]
    columns = ",".join(["NAME:.metadata.name", *labels])
    print(cluster.kubectl("get", "nodes", "-o", f"custom-columns={columns}").stdout, end="")


def up(real_node: bool = False) -> int:
    state_file = STATE_DIR / "state.json"
    if state_file.exists():
        print(f"a cluster is already up (state in {state_file}); run 'make cluster-down' first", file=sys.stderr)
        return 1
    if real_node:
        from atom_localcluster.realnode import RealNodeCluster

        cluster: Cluster = RealNodeCluster(workdir=STATE_DIR / "run", detached=True)
    else:
        cluster = Cluster(workdir=STATE_DIR / "run", detached=True)
    try:
        cluster.start()
    except HarnessError as e:
        print(f"cluster-up failed: {e}", file=sys.stderr)
        return 1
    state_file.write_text(json.dumps(cluster.state(), indent=2))
    print_nodes(cluster)
    print(f"\nexport KUBECONFIG={cluster.kubeconfig}\n(stop it with: make cluster-down)")
    return 0


def down() -> int:
    state_file = STATE_DIR / "state.json"
    if not state_file.exists():
        print("no cluster is up")
        return 0
    state = json.loads(state_file.read_text())
    kill_pids(state["pids"])
    if state.get("realnode"):
        from atom_localcluster.realnode import NodeResources, teardown

        teardown(NodeResources(**state["realnode"]))
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    print("cluster stopped and removed")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m atom_localcluster", description=__doc__)
    p.add_argument("command", choices=["up", "down"])
    p.add_argument("--real-node", action="store_true", help="up: add the real node (containerd, kubelet, kube-proxy)")
    args = p.parse_args(argv)
    return up(args.real_node) if args.command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
