"""End to end on the real node: the chart's operator turns an AtomDeployment into engine pods that serve.

Both images are built (tests/harness/docker.py), imported into the node's containerd and installed with helm;
the AtomDeployment runs decode + prefill on the cpu backend with builtin:tiny. The tests below run in file order
against that one deployment and end by deleting it. The steps live in tests/realnode/scenario.py, shared with the
kind path.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator

import openai
import pytest

from tests.harness.docker import BuildResult
from tests.harness.realnode import NODE_NAME, RealNodeCluster
from tests.images.conftest import docker_daemon, engine_image, operator_image  # noqa: F401 - session fixtures
from tests.realnode import scenario
from tests.realnode.kube import port_forward, wait_for

# Cold: the images build (~3 GB of wheels) and the engine image (~5 GB) is imported; longer than the default limit.
pytestmark = [pytest.mark.realnode, pytest.mark.timeout(3600)]
NAME = "tiny"


@pytest.fixture(scope="module")
def e2e_namespace(real_node: RealNodeCluster) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    real_node.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        real_node.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def installed(real_node: RealNodeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """Both images on the node and the chart installed; yields the engine image reference."""
    operator: BuildResult = request.getfixturevalue("operator_image")  # tests/images' session fixtures
    engine: BuildResult = request.getfixturevalue("engine_image")
    for image in (operator, engine):
        real_node.import_image(image.tag)
    scenario.helm_install(real_node, operator.tag, engine.tag)
    try:
        yield engine.tag
    finally:
        scenario.helm_uninstall(real_node)


@pytest.fixture(scope="module")
def served(real_node: RealNodeCluster, installed: str, e2e_namespace: str) -> dict:
    real_node.apply(scenario.atomdeployment(NAME), "-n", e2e_namespace)
    return scenario.wait_ready(real_node, e2e_namespace, NAME)


@pytest.fixture(scope="module")
def api(real_node: RealNodeCluster, served: dict, e2e_namespace: str) -> Iterator[openai.OpenAI]:
    """The openai client on a port-forward to the AtomDeployment's Service (127.0.0.1 only)."""
    with port_forward(real_node, e2e_namespace, f"svc/{NAME}", scenario.HTTP_PORT) as port:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(api: openai.OpenAI) -> str:
    return api.models.list().data[0].id


def test_ready_with_pods_on_the_real_node(real_node: RealNodeCluster, served: dict, e2e_namespace: str) -> None:
    status = served["status"]
    assert status["decode"]["summary"] == "1/1" and status["prefill"]["summary"] == "1/1"
    for role in ("decode", "prefill"):
        (pod,) = scenario.running_pods(real_node, e2e_namespace, NAME, role)
        assert pod["spec"]["nodeName"] == NODE_NAME
        # Ready means the kubelet's real HTTP probe got 200 from /ready: the model is loaded.
        assert pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert all(c["ready"] for c in pod["status"]["containerStatuses"])


def test_chat_completion(api: openai.OpenAI, model: str) -> None:
    out = api.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.completion_tokens >= 1


def test_chat_completion_streaming(api: openai.OpenAI, model: str) -> None:
    stream = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Stream to me"}], max_tokens=8, stream=True
    )
    chunks = list(stream)
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason in ("stop", "length", None)
    assert any(c.choices and c.choices[0].finish_reason in ("stop", "length") for c in chunks)


def test_the_prefill_worker_did_the_prefill(
    real_node: RealNodeCluster, api: openai.OpenAI, model: str, e2e_namespace: str
) -> None:
    (decode,) = scenario.running_pods(real_node, e2e_namespace, NAME, "decode")
    (prefill,) = scenario.running_pods(real_node, e2e_namespace, NAME, "prefill")
    before = scenario.metrics(prefill)["atom:prefill_requests_total"]
    api.chat.completions.create(model=model, messages=[{"role": "user", "content": "Prefill me"}], max_tokens=4)
    assert scenario.metrics(prefill)["atom:prefill_requests_total"] > before
    decode_metrics = scenario.metrics(decode)
    assert decode_metrics["atom:pd_remote_prefills_total"] >= 1
    assert decode_metrics["atom:prefill_tokens_computed_total"] == 0  # remote-only: decode never prefills itself


def test_scale_decode_to_two_and_back(real_node: RealNodeCluster, served: dict, e2e_namespace: str) -> None:
    scenario.patch_spec(real_node, e2e_namespace, NAME, {"decode": {"replicas": 2}})
    status = scenario.wait_ready(real_node, e2e_namespace, NAME, what="READY with 2 decode pods")["status"]
    assert status["decode"]["summary"] == "2/2"
    pods = scenario.running_pods(real_node, e2e_namespace, NAME, "decode")
    assert len(pods) == 2 and all(p["spec"]["nodeName"] == NODE_NAME for p in pods)

    scenario.patch_spec(real_node, e2e_namespace, NAME, {"decode": {"replicas": 1}})
    status = scenario.wait_ready(real_node, e2e_namespace, NAME, what="READY back at 1 decode pod")["status"]
    assert status["decode"]["summary"] == "1/1"
    wait_for(lambda: len(scenario.pods(real_node, e2e_namespace, NAME, "decode")) == 1, 120,
             "the second decode pod to be gone", real_node)


def test_killed_decode_process_is_restarted_by_the_kubelet(
    real_node: RealNodeCluster, api: openai.OpenAI, model: str, e2e_namespace: str
) -> None:
    (pod,) = scenario.running_pods(real_node, e2e_namespace, NAME, "decode")
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    containerd = real_node.containerd
    assert containerd is not None
    # The engine container's task in the node's containerd: its PID is a host PID we can kill.
    cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    pid = int(containerd.ctr("tasks", "list").stdout.decode().split(cid, 1)[1].split()[0])
    os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        p = real_node.get("pod", pod["metadata"]["name"], "-n", e2e_namespace)
        return p["status"]["containerStatuses"][0]["restartCount"] > restarts

    wait_for(restarted, 120, "the kubelet to restart the killed engine container", real_node)
    status = scenario.wait_ready(real_node, e2e_namespace, NAME, what="READY after the restart")["status"]
    assert status["decode"]["summary"] == "1/1"
    # Same pod, new process: the Service (and the port-forward to it) serve again.
    with port_forward(real_node, e2e_namespace, f"svc/{NAME}", scenario.HTTP_PORT) as port:
        fresh = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        out = fresh.chat.completions.create(model=model, messages=[{"role": "user", "content": "Back?"}], max_tokens=4)
    assert out.usage is not None and out.usage.completion_tokens >= 1


def test_delete_removes_every_pod_and_container(real_node: RealNodeCluster, served: dict, e2e_namespace: str) -> None:
    uids = {p["metadata"]["uid"] for p in scenario.pods(real_node, e2e_namespace, NAME)}
    assert uids
    real_node.kubectl("delete", scenario.GROUP, NAME, "-n", e2e_namespace, "--wait=true", "--timeout=120s")
    wait_for(lambda: not scenario.pods(real_node, e2e_namespace, NAME), 180, "every engine pod to be gone", real_node)
    for kind in ("deployments", "services", "configmaps"):
        left = real_node.get(kind, "-n", e2e_namespace, "-l", f"app.kubernetes.io/instance={NAME}")["items"]
        assert left == [], f"{kind} left behind: {[o['metadata']['name'] for o in left]}"
    containerd = real_node.containerd
    assert containerd is not None

    def no_containers() -> bool:
        labels = [json.loads(containerd.ctr("containers", "info", c).stdout)["Labels"] for c in containerd.containers()]
        return not any(lab.get("io.kubernetes.pod.uid") in uids for lab in labels)

    wait_for(no_containers, 120, "containerd to drop the engine pods' containers", real_node)
