"""Drain-aware scale-down on the real control plane: the session's operator decides from real engines' metrics
(one paced engine per kwok pod on a loopback address, the pod's IP patched to it), cordons the idlest pod, waits
until its stream has ended, and only then lets the ReplicaSet remove exactly that pod; an operator restart in the
middle resumes the drain, and turning autoscaling off un-cordons."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from atom_localcluster.processes import Processes, wait_http
from atom_localcluster.routing.stack import loopback_addresses, set_pod_ip
from atom_localcluster.wait import wait_for
from atom_operator.children.meta import ACCEPTING

from tests import pacing
from tests.operator.conftest import atomdeployment
from tests.operator.external_metrics import ExternalMetrics

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]

STEP_MS = 50.0  # a decode step: 20 tokens a second per lane, whatever the machine does meanwhile
COST = "controller.kubernetes.io/pod-deletion-cost"
SPEC = {
    "decode": {"replicas": 2, "backend": "cpu", "npusPerReplica": 0, "lanes": 4, "kvBlocks": 5,
               "prefixCache": False, "speculativeTokens": 0},
    "autoscaling": {"mode": "Off", "intervalSeconds": 2,
                    "decode": {"minReplicas": 1, "maxReplicas": 2, "targetOccupancyPercent": 100},
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}, "drain": {"timeoutSeconds": 300}},
}  # fmt: skip


def decode_pods(cluster, namespace: str) -> dict[str, dict]:
    items = cluster.get("pods", "-n", namespace, "-l", "app.kubernetes.io/component=decode")["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def start_engines(cluster, namespace: str, procs: Processes) -> dict[str, str]:
    """A paced engine per decode pod as its pod spec says, on the pod's own loopback address (its HTTP and metrics
    ports unchanged); {pod: base URL}."""
    pods = decode_pods(cluster, namespace)
    urls = {}
    for (name, pod), address in zip(sorted(pods.items()), loopback_addresses(len(pods)), strict=True):
        argv = pod["spec"]["containers"][0]["command"]
        config_map = next(v for v in pod["spec"]["volumes"] if v["name"] == "config")["configMap"]["name"]
        settings = next(iter(cluster.get("configmap", config_map, "-n", namespace)["data"].values()))
        config = procs.workdir / f"{name}.yaml"
        config.write_text(settings)
        local = [sys.executable, "-m", "tests.pacing", *argv[1:]]
        local[local.index("--config") + 1] = str(config)
        env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **pacing.env(decode_step_ms=STEP_MS)}
        proc, log = procs.start(name, [*local, "--host", address], env)
        port = argv[argv.index("--port") + 1]
        urls[name] = f"http://{address}:{port}"
        set_pod_ip(cluster, namespace, name, address)
        wait_http(f"{urls[name]}/ready", proc, log, timeout=180)
    return urls


def running(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))  # fmt: skip


class Stream(threading.Thread):
    """One streamed completion straight to a pod; records how it ended and when."""

    def __init__(self, url: str, tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.tokens = url, tokens
        self.finish: str | None = None
        self.received = 0
        self.error: BaseException | None = None
        self.ended = 0.0

    def run(self) -> None:
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=120)
        try:
            for chunk in client.completions.create(model="llm", prompt="tell me", max_tokens=self.tokens,
                                                   stream=True, extra_body={"ignore_eos": True}):  # fmt: skip
                if chunk.choices:
                    self.received += 1
                    self.finish = chunk.choices[0].finish_reason or self.finish
        except BaseException as e:  # noqa: BLE001 - the test reports it
            self.error = e
        self.ended = time.time()


def set_mode(cluster, namespace: str, mode: str) -> None:
    patch = {"spec": {"autoscaling": {"mode": mode}}}
    cluster.kubectl("patch", "atomdeployment", "llm", "-n", namespace, "--type=merge", "-p", json.dumps(patch))


def cordoned(cluster, namespace: str) -> list[str]:
    return [n for n, p in decode_pods(cluster, namespace).items() if p["metadata"]["labels"].get(ACCEPTING) == "false"]


def drained_scale_down(cluster, op, namespace: str, tmp_path: Path, mode: str, restart: bool) -> None:  # noqa: ANN001
    """Two decode pods, two long streams on one and a shorter one on the other; then a scale-down to one (from
    the decision in mode Operator, from the scale subresource in External): the quiet pod is cordoned with its
    stream running and removed only after the stream ended."""
    cluster.apply(atomdeployment("llm", namespace, **SPEC))
    wait_for(lambda: len(decode_pods(cluster, namespace)) == 2, "two decode pods")
    service = cluster.get("service", "llm", "-n", namespace)
    assert service["spec"]["selector"][ACCEPTING] == "true"  # the cordon takes a pod out of the Service
    procs = Processes(tmp_path)
    try:
        urls = start_engines(cluster, namespace, procs)
        busy, quiet = sorted(urls)
        # Two long streams on one pod, one shorter on the other: 3 sequences fit one pod of 4 lanes at 100 %.
        long = [Stream(urls[busy], 300) for _ in range(2)]  # 15 s at the pace
        short = Stream(urls[quiet], 160)  # 8 s
        for s in (*long, short):
            s.start()
        wait_for(lambda: running(urls[busy]) == 2 and running(urls[quiet]) == 1, "the streams decoding", timeout=60)
        set_mode(cluster, namespace, mode)
        if mode == "External":  # what an HPA does: the scale subresource
            cluster.kubectl("scale", "atomdeployment/llm", "-n", namespace, "--replicas=1")
        victim = wait_for(lambda: cordoned(cluster, namespace), "a cordoned pod", timeout=60)
        cordoned_at = time.time()
        assert victim == [quiet]  # the one with the least in flight
        if restart:  # the operator goes away mid-drain; the next one finds the label and resumes
            op.restart()
        wait_for(lambda: quiet not in decode_pods(cluster, namespace), "the drained pod removed", timeout=120)
        removed_at = time.time()
        for s in (*long, short):
            s.join(60)
        assert short.error is None and short.finish == "length", (short.error, short.finish)
        assert cordoned_at < short.ended <= removed_at  # cordoned with its stream running, deleted after it ended
        assert all(s.error is None and s.finish == "length" for s in long)
        assert list(decode_pods(cluster, namespace)) == [busy]  # exactly the victim went
        assert cordoned(cluster, namespace) == []
        obj = cluster.get("atomdeployment", "llm", "-n", namespace)
        assert obj["status"]["autoscaling"]["decode"]["desiredReplicas"] == 1
        assert "conditions" not in obj["status"]["autoscaling"]
        # HPA's conditions beside Ready, where kubectl describe and kubectl wait read them.
        wait_for(lambda: {"Ready", "ScalingActive", "ScalingLimited", "AbleToScale"} <= {
            c["type"] for c in cluster.get("atomdeployment", "llm", "-n", namespace)["status"].get("conditions") or []
        }, "the autoscaling conditions in status.conditions", timeout=30)  # fmt: skip
        assert cluster.get("deployment", "llm-decode", "-n", namespace)["spec"]["replicas"] == 1
        reasons = {e["reason"] for e in cluster.get("events", "-n", namespace)["items"]}
        assert {"DrainStarted", "DrainFinished", "ScaledDown"} <= reasons, reasons
    finally:
        procs.stop()


def test_scale_down_drains_the_idlest_pod_and_survives_an_operator_restart(
    cluster, op, namespace: str, tmp_path: Path  # noqa: ANN001
) -> None:
    drained_scale_down(cluster, op, namespace, tmp_path, "Operator", restart=True)


def test_external_mode_scale_down_through_the_scale_subresource_drains_too(
    cluster, op, namespace: str, tmp_path: Path  # noqa: ANN001
) -> None:
    drained_scale_down(cluster, op, namespace, tmp_path, "External", restart=False)


def autoscaler_series(op, namespace: str) -> list[str]:  # noqa: ANN001
    """The operator's series of this namespace's autoscaling: the autoscaler's own, and its conditions'."""
    return [line for line in op.metrics().splitlines() if f'namespace="{namespace}"' in line and (
        line.startswith("atom_autoscaler_") or re.search(r'type="(ScalingActive|ScalingLimited|AbleToScale)"', line))]


def test_turning_autoscaling_off_uncordons_and_restores_the_spec(
    cluster, op, namespace: str, tmp_path: Path  # noqa: ANN001
) -> None:
    cluster.apply(atomdeployment("llm", namespace, **SPEC))
    wait_for(lambda: len(decode_pods(cluster, namespace)) == 2, "two decode pods")
    procs = Processes(tmp_path)
    try:
        urls = start_engines(cluster, namespace, procs)
        streams = [Stream(url, 400) for url in urls.values()]  # 20 s: both pods busy through the test
        for s in streams:
            s.start()
        wait_for(lambda: all(running(url) == 1 for url in urls.values()), "the streams decoding", timeout=60)
        set_mode(cluster, namespace, "Operator")
        victim = wait_for(lambda: cordoned(cluster, namespace), "a cordoned pod", timeout=60)
        assert autoscaler_series(op, namespace), "the decision's series on the operator's /metrics"
        set_mode(cluster, namespace, "Off")
        wait_for(lambda: not cordoned(cluster, namespace), "no pod cordoned", timeout=30)
        pods = decode_pods(cluster, namespace)
        assert victim[0] in pods and COST not in (pods[victim[0]]["metadata"].get("annotations") or {})
        assert cluster.get("deployment", "llm-decode", "-n", namespace)["spec"]["replicas"] == 2
        wait_for(lambda: not {"ScalingActive", "ScalingLimited", "AbleToScale"} & {
            c["type"] for c in cluster.get("atomdeployment", "llm", "-n", namespace)["status"].get("conditions") or []
        }, "no autoscaling condition once autoscaling is off", timeout=30)  # fmt: skip
        # No stale series: neither the autoscaler's nor those of its conditions (gone from status.conditions).
        wait_for(lambda: not autoscaler_series(op, namespace), "no autoscaling series once it is off", timeout=30)
        for s in streams:
            s.join(60)
            assert s.error is None and s.finish == "length"
    finally:
        procs.stop()


def test_the_real_hpa_scales_decode_and_its_scale_down_is_drained(
    cluster, op, namespace: str, tmp_path: Path  # noqa: ANN001
) -> None:
    """External mode with the harness's own HPA controller: it reads a metric from an external metrics API and
    writes spec.decode.replicas through the scale subresource; the operator grows decode at once and drains
    every pod it removes."""
    spec = json.loads(json.dumps(SPEC))
    spec["decode"]["replicas"] = 1
    spec["autoscaling"].update(mode="External", decode={"minReplicas": 1, "maxReplicas": 3})
    cluster.apply(atomdeployment("llm", namespace, **spec))
    wait_for(lambda: len(decode_pods(cluster, namespace)) == 1, "one decode pod")
    metric = "atom_test_load"
    with ExternalMetrics(cluster) as server:
        server.values[metric] = 10.0  # 10 at 4 a pod: 3 pods
        wait_for(lambda: any(c["type"] == "Available" and c["status"] == "True" for c in
                             (cluster.get("apiservice", "v1beta1.external.metrics.k8s.io").get("status") or {})
                             .get("conditions") or []), "the external metrics API available", timeout=60)  # fmt: skip
        cluster.apply({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "llm", "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "serving.atom.dev/v1alpha1", "kind": "AtomDeployment",
                                        "name": "llm"},
                     "minReplicas": 1, "maxReplicas": 3,
                     "metrics": [{"type": "External", "external": {"metric": {"name": metric},
                                                                   "target": {"type": "AverageValue",
                                                                              "averageValue": "4"}}}],
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}},
        })  # fmt: skip
        wait_for(lambda: len(decode_pods(cluster, namespace)) == 3, "the HPA's 3 decode pods", timeout=240)
        assert cluster.get("atomdeployment", "llm", "-n", namespace)["spec"]["decode"]["replicas"] == 3
        procs = Processes(tmp_path)
        try:
            start_engines(cluster, namespace, procs)
            server.values[metric] = 2.0  # one pod
            seen_cordoned: set[str] = set()
            before = set(decode_pods(cluster, namespace))

            def down_to_one() -> bool:
                seen_cordoned.update(cordoned(cluster, namespace))
                return len(decode_pods(cluster, namespace)) == 1

            wait_for(down_to_one, "the HPA's scale-down to one pod", timeout=240, interval=0.2)
            removed = before - set(decode_pods(cluster, namespace))
            assert len(removed) == 2 and removed <= seen_cordoned  # every pod removed was drained first
            assert cordoned(cluster, namespace) == []
            reasons = {e["reason"] for e in cluster.get("events", "-n", namespace)["items"]}
            assert {"DrainStarted", "DrainFinished"} <= reasons, reasons
        finally:
            procs.stop()
            cluster.kubectl("delete", "hpa", "llm", "-n", namespace, check=False)


def test_load_returning_during_a_drain_uncordons_the_pod(cluster, op, namespace: str, tmp_path: Path) -> None:  # noqa: ANN001
    """A pod cordoned with a stream running goes back into service when the load comes back: no cold start."""
    cluster.apply(atomdeployment("llm", namespace, **SPEC))
    wait_for(lambda: len(decode_pods(cluster, namespace)) == 2, "two decode pods")
    procs = Processes(tmp_path)
    try:
        urls = start_engines(cluster, namespace, procs)
        busy, quiet = sorted(urls)
        first = [Stream(urls[busy], 400), Stream(urls[quiet], 400)]  # 20 s each
        for s in first:
            s.start()
        wait_for(lambda: all(running(url) == 1 for url in urls.values()), "the streams decoding", timeout=60)
        set_mode(cluster, namespace, "Operator")
        victim = wait_for(lambda: cordoned(cluster, namespace), "a cordoned pod", timeout=60)[0]
        serving = quiet if victim == busy else busy
        # Six more streams on the pod still serving: 7 sequences need two pods of 4 lanes at 100 %.
        more = [Stream(urls[serving], 200) for _ in range(6)]
        for s in more:
            s.start()
        wait_for(lambda: not cordoned(cluster, namespace), "the victim back in service", timeout=60)
        assert set(decode_pods(cluster, namespace)) == set(urls)  # the same two pods: nothing started cold
        reasons = {e["reason"] for e in cluster.get("events", "-n", namespace)["items"]}
        assert "DrainCancelled" in reasons, reasons
        for s in (*first, *more):
            s.join(90)
            assert s.error is None and s.finish == "length", (s.error, s.finish)
    finally:
        procs.stop()
