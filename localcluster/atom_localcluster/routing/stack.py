"""Decode pods served for real behind a router, on the local control plane (tests/routing, make bench-routing).

kwok's pods run nothing and have addresses from the harness's pod CIDR that route nowhere, so each decode pod's
engine runs here as a local process exactly as its pod spec says (the Deployment's command and args, the
rendered settings from its ConfigMap), bound to a loopback address of its own (127.77.<n>.<i>, the pod's port
unchanged), and the pod's ``status.podIP`` is patched to that address. Every consumer of pod addresses (the
endpoint picker, which watches pods and scrapes ``<podIP>:<port>/metrics``, and Envoy, which connects where the
picker says) then reaches the engine with nothing faked in between. Loopback rather than a network namespace:
all of 127.0.0.0/8 reaches the host's loopback interface with no setup, no root and no routes that another
job's bridge (10.244.<n>.0/24, atom_localcluster/realnode.py) could collide with.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from atom_localcluster import envoy, tools
from atom_localcluster.cluster import Cluster, free_port
from atom_localcluster.processes import Processes, wait_http

BIN = Path(sys.executable).parent


def loopback_addresses(count: int) -> list[str]:
    """``count`` loopback addresses no other run of this module uses at the same time (keyed by the pid)."""
    subnet = os.getpid() % 250 + 1
    return [f"127.77.{subnet}.{i + 2}" for i in range(count)]


@dataclass(frozen=True)
class Pod:
    name: str
    address: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


def decode_pods(cluster: Cluster, namespace: str, name: str) -> list[dict]:
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=decode"
    pods = cluster.get("pods", "-n", namespace, "-l", selector)["items"]
    return sorted((p for p in pods if p["metadata"].get("deletionTimestamp") is None),
                  key=lambda p: p["metadata"]["name"])


def start_engines(cluster: Cluster, namespace: str, name: str, procs: Processes, tag: str) -> list[Pod]:
    """One engine per decode pod, as its pod spec says, on the pod's (patched) address; waits until all are ready."""
    pods = decode_pods(cluster, namespace, name)
    started = []
    for pod, address in zip(pods, loopback_addresses(len(pods)), strict=True):
        container = pod["spec"]["containers"][0]
        argv = container["command"] + container.get("args", [])
        config_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "config")
        settings = next(iter(cluster.get("configmap", "-n", namespace,
                                         config_volume["configMap"]["name"])["data"].values()))
        config = procs.workdir / f"{pod['metadata']['name']}.yaml"
        config.write_text(settings)
        port = int(argv[argv.index("--port") + 1])
        local = [str(BIN / argv[0])]
        for prev, arg in zip(argv, argv[1:], strict=False):
            local.append(str(config) if prev == "--config" else str(free_port()) if prev == "--metrics-port" else arg)
        # One torch thread each: the engines, the picker, Envoy and the client share the machine's cores.
        proc, log = procs.start(f"{tag}-{pod['metadata']['name']}", [*local, "--host", address],
                                {"OMP_NUM_THREADS": "1"})
        started.append((proc, log, Pod(pod["metadata"]["name"], address, port)))
        set_pod_ip(cluster, namespace, pod["metadata"]["name"], address)
    for proc, log, p in started:
        wait_http(f"{p.url}/ready", proc, log, timeout=300)
    return [p for _proc, _log, p in started]


def set_pod_ip(cluster: Cluster, namespace: str, pod: str, address: str) -> None:
    patch = {"status": {"podIP": address, "podIPs": [{"ip": address}]}}
    cluster.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge",
                    "-p", yaml.safe_dump(patch))


def start_router(kind: str, cluster: Cluster, namespace: str, pool: str, pods: list[Pod], procs: Processes,
                 tag: str) -> str:
    """Envoy in front of ``pods``: asking a picker per request (GIE's EPP "epp", or its round-robin "lwepp"), or
    picking at random itself, as a Service does ("random"). Returns its base URL."""
    listen, admin = free_port(), free_port()
    if kind in envoy.PROCESSING:
        grpc, health, metrics = free_port(), free_port(), free_port()
        argv = (epp_as_the_pod_runs_it(cluster, namespace, pool, grpc, health, metrics) if kind == "epp"
                else lwepp_argv(pool, namespace, grpc, health, metrics))
        picker, log = procs.start(f"{tag}-{kind}", argv, {"KUBECONFIG": str(cluster.kubeconfig)})
        wait_http(f"http://127.0.0.1:{metrics}/metrics", picker, log, timeout=120)
        config = envoy.picked_by(("127.0.0.1", grpc), listen, admin, kind)
    elif kind == "random":
        config = envoy.balanced([(p.address, p.port) for p in pods], listen, admin, "RANDOM")
    else:
        raise ValueError(f"no router {kind!r}: epp, lwepp or random")
    path = procs.workdir / f"{tag}-envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    proxy, log = procs.start(f"{tag}-envoy", [str(envoy.binary()), "-c", str(path), "--concurrency", "1",
                                             "--log-level", "warn", "--base-id", str(listen)])
    wait_http(f"http://127.0.0.1:{admin}/ready", proxy, log, timeout=60)
    url = f"http://127.0.0.1:{listen}"
    wait_routes_to_all(url, pods, model=pool)  # the engines serve the AtomDeployment's name
    return url


def wait_routes_to_all(url: str, pods: list[Pod], model: str, timeout: float = 90) -> None:
    """Until requests through the router have reached every pod (a picker answers 5xx until it has synced its pool
    and pods). The probes ask for more tokens than any engine allows, so each is refused with a 400 before it
    touches a lane, a KV block or the prefix cache; under 64 characters, the picker's prefix index skips it."""
    body = json.dumps({"model": model, "prompt": "probe", "max_tokens": 10**6}).encode()
    start = {p.url: _rejected(p) for p in pods}
    end = time.monotonic() + timeout
    while any(_rejected(p) == start[p.url] for p in pods):
        if time.monotonic() > end:
            raise RuntimeError(f"the router at {url} did not reach every pod in {timeout:.0f}s")
        request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
        with contextlib.suppress(urllib.error.HTTPError, OSError):
            urllib.request.urlopen(request, timeout=10).close()
        time.sleep(0.2)


def _rejected(pod: Pod) -> float:
    with urllib.request.urlopen(f"{pod.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(r"^atom:requests_rejected_total{[^}]*} (\S+)$", text, re.M))


def epp_as_the_pod_runs_it(cluster: Cluster, namespace: str, pool: str, grpc: int, health: int,
                           metrics: int) -> list[str]:
    """The pinned EPP with the operator's ``<pool>-epp`` Deployment's args, on free local ports, and plain gRPC
    (the Envoy here speaks no TLS to it; in the cluster it serves TLS, as the extension's gateways expect)."""
    from atom_operator.children.meta import EPP_SUFFIX

    deployment = cluster.get("deployment", "-n", namespace, pool + EPP_SUFFIX)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    ports = {"--grpc-port": grpc, "--grpc-health-port": health, "--metrics-port": metrics}
    local = [str(ports[prev]) if prev in ports else arg for prev, arg in zip(["", *args], args, strict=False)]
    return [str(tools.path("epp")), *local, "--secure-serving=false"]


def lwepp_argv(pool: str, namespace: str, grpc: int, health: int, metrics: int) -> list[str]:
    """GIE v1.6.0's lightweight round-robin picker for ``pool``: plain gRPC to the local Envoy, free local ports."""
    return [str(tools.path("lwepp")), "--pool-name", pool, "--pool-namespace", namespace, "--grpc-port", str(grpc),
            "--grpc-health-port", str(health), "--metrics-port", str(metrics), "--secure-serving=false"]
