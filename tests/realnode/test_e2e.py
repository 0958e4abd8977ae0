"""End to end: the chart's operator turns examples/atomdeployment-pd.yaml into engine pods that serve.

Two ways to get a cluster whose pods really run, then the same steps (tests/realnode/scenario.py) on it:

- the real node (marker ``realnode``, part of ``make test``): both images are built (atom_localcluster/docker.py) and
  imported into the node's containerd; the tests below run in file order against one deployment and end by
  deleting it;
- kind (marker ``kind``: ``make e2e-kind``, also the last step of ``make test``): a kind cluster on the node image
  built here (atom_localcluster/kindnode.py; ``KIND_NODE_IMAGE`` picks another), fake NPUs advertised on its node,
  both images ``kind load``-ed, then install, serve, roll with a client looping, delete, and the cluster is
  deleted.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator

import openai
import pytest
from atom_localcluster.images import base, daemon
from atom_localcluster.images.builds import BuildResult
from atom_localcluster.kind import KindCluster, cleanup_on_signals
from atom_localcluster.realnode import NODE_NAME, RealNodeCluster

from tests.images.conftest import docker_daemon, engine_image, operator_image  # noqa: F401 - session fixtures
from tests.realnode import scenario
from tests.realnode.kube import port_forward, wait_for

# Cold: the images build (~3 GB of wheels) and the engine image (~5 GB) is imported; longer than the default limit.
pytestmark = [pytest.mark.timeout(3600)]
REALNODE = pytest.mark.realnode  # per test, not per module: the kind test must not carry it
NAME = "tiny"  # examples/atomdeployment-pd.yaml's name


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
    real_node.apply(scenario.atomdeployment(), "-n", e2e_namespace)
    return scenario.wait_ready(real_node, e2e_namespace, NAME)


@pytest.fixture(scope="module")
def api(real_node: RealNodeCluster, served: dict, e2e_namespace: str) -> Iterator[openai.OpenAI]:
    with scenario.openai_api(real_node, e2e_namespace, NAME) as api:
        yield api


@pytest.fixture(scope="module")
def model(api: openai.OpenAI) -> str:
    return api.models.list().data[0].id


@REALNODE
def test_ready_with_pods_on_the_real_node(real_node: RealNodeCluster, served: dict, e2e_namespace: str) -> None:
    status = served["status"]
    assert status["decode"]["summary"] == "1/1" and status["prefill"]["summary"] == "1/1"
    for role in ("decode", "prefill"):
        (pod,) = scenario.running_pods(real_node, e2e_namespace, NAME, role)
        assert pod["spec"]["nodeName"] == NODE_NAME
        # Ready means the kubelet's real HTTP probe got 200 from /ready: the model is loaded.
        assert pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert all(c["ready"] for c in pod["status"]["containerStatuses"])
    # Each pod's NPU came from the node's device plugin: one /dev/rbln<N> (its own) and /dev/rsd0 in the container.
    devices = {role: npu_devices(real_node, e2e_namespace, pod) for role in ("decode", "prefill")
               for pod in scenario.running_pods(real_node, e2e_namespace, NAME, role)}
    for role, found in devices.items():
        assert len([d for d in found if d.startswith("/dev/rbln")]) == 1 and "/dev/rsd0" in found, (role, found)
    assert not {d for d in devices["decode"] if d.startswith("/dev/rbln")} & set(devices["prefill"]), devices
    # The engine's own device discovery (what the atom backend drives), run in the decode container, finds that card.
    (decode,) = scenario.running_pods(real_node, e2e_namespace, NAME, "decode")
    (card,) = (d.removeprefix("/dev/rbln") for d in devices["decode"] if d.startswith("/dev/rbln"))
    found = real_node.kubectl("exec", "-n", e2e_namespace, decode["metadata"]["name"], "--", "python3", "-c",
                              ENGINE_DEVICES).stdout
    assert f"event=atom_devices num_devices=1 devices={card} source=/dev/rbln* visible={card}" in found, found


# atom_engine.backends.devices.visible_devices logs the cards it found (RBLN_VISIBLE_DEVICES, else /dev/rbln*).
ENGINE_DEVICES = (
    "import logging, sys\n"
    "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
    "from atom_engine.backends.devices import visible_devices\n"
    "visible_devices(1)\n"
)


def npu_devices(node: RealNodeCluster, namespace: str, pod: dict) -> list[str]:
    """The NPU device nodes inside the pod's engine container."""
    listing = "import glob; print(*sorted(glob.glob('/dev/rbln*') + glob.glob('/dev/rsd*')))"
    return node.kubectl("exec", "-n", namespace, pod["metadata"]["name"], "--", "python3", "-c", listing).stdout.split()


@REALNODE
def test_chat_completion(api: openai.OpenAI) -> None:
    scenario.chat(api)


@REALNODE
def test_chat_completion_streaming(api: openai.OpenAI, model: str) -> None:
    stream = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Stream to me"}], max_tokens=8, stream=True
    )
    chunks = list(stream)
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason in ("stop", "length", None)
    assert any(c.choices and c.choices[0].finish_reason in ("stop", "length") for c in chunks)


@REALNODE
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


@pytest.fixture(scope="module")
def client(real_node: RealNodeCluster, served: dict, e2e_namespace: str, base_image: str, model: str
           ) -> scenario.LoopingClient:
    real_node.apply(scenario.client_pod(base_image), "-n", e2e_namespace)
    wait_for(lambda: all(c["ready"] for c in real_node.get("pod", "client", "-n", e2e_namespace)["status"].get(
        "containerStatuses", [{"ready": False}])), 120, "the client pod", real_node)
    url = f"http://{NAME}.{e2e_namespace}.svc:{scenario.HTTP_PORT}/v1/chat/completions"
    return scenario.LoopingClient(real_node, e2e_namespace, "client", url, model)


@REALNODE
def test_scale_decode_to_two_and_roll_lanes_without_a_failed_request(
    real_node: RealNodeCluster, client: scenario.LoopingClient, e2e_namespace: str
) -> None:
    scenario.patch_spec(real_node, e2e_namespace, NAME, {"decode": {"replicas": 2}})
    status = scenario.wait_ready(real_node, e2e_namespace, NAME, what="READY with 2 decode pods")["status"]
    assert status["decode"]["summary"] == "2/2"
    old = {p["metadata"]["name"] for p in scenario.running_pods(real_node, e2e_namespace, NAME, "decode")}
    assert len(old) == 2
    prefill = {p["metadata"]["name"] for p in scenario.running_pods(real_node, e2e_namespace, NAME, "prefill")}

    with client.running():
        wait_for(lambda: client.oks() >= 3, 120, "3 answers before the rollout", real_node)
        scenario.patch_spec(real_node, e2e_namespace, NAME, {"decode": {"lanes": 2, "kvBlocks": 4}})
        scenario.wait_ready(real_node, e2e_namespace, NAME, what="READY after the lanes rollout")
        wait_for(lambda: not {p["metadata"]["name"] for p in scenario.pods(real_node, e2e_namespace, NAME, "decode")}
                 & old, 180, "the old decode pods to be gone", real_node)
        new = {p["metadata"]["name"] for p in scenario.running_pods(real_node, e2e_namespace, NAME, "decode")}
        seen = client.oks()
        wait_for(lambda: client.oks() >= seen + 3, 120, "3 answers after the rollout", real_node)
    assert new and not new & old, f"decode pods were not replaced: before {old}, after {new}"
    # lanes and kvBlocks are decode's alone: the prefill worker kept running through the rollout.
    assert {p["metadata"]["name"] for p in scenario.running_pods(real_node, e2e_namespace, NAME, "prefill")} == prefill
    print(f"lanes rollout: {len(client.results)} lines, {client.oks()} answered, {len(client.failures())} failed")
    assert client.failures() == [], f"{len(client.failures())} of {len(client.results)} requests failed: " + "\n".join(
        client.failures()[:10])

    scenario.patch_spec(real_node, e2e_namespace, NAME, {"decode": {"replicas": 1}})
    status = scenario.wait_ready(real_node, e2e_namespace, NAME, what="READY back at 1 decode pod")["status"]
    assert status["decode"]["summary"] == "1/1"
    wait_for(lambda: len(scenario.pods(real_node, e2e_namespace, NAME, "decode")) == 1, 120,
             "the second decode pod to be gone", real_node)


@REALNODE
def test_roll_the_single_prefill_worker_without_a_failed_request(
    real_node: RealNodeCluster, client: scenario.LoopingClient, e2e_namespace: str
) -> None:
    # One prefill pod: the new one surges beside it, the old one drains, decoders retry while the name
    # re-resolves. A changed pod template (here a cpu request) rolls prefill alone.
    (old,) = (p["metadata"]["name"] for p in scenario.running_pods(real_node, e2e_namespace, NAME, "prefill"))
    npu = {"limits": {scenario.NPU_RESOURCE: "1"}, "requests": {"cpu": "10m"}}
    client.results.clear()
    with client.running():
        wait_for(lambda: client.oks() >= 3, 120, "3 answers before the prefill rollout", real_node)
        scenario.patch_spec(real_node, e2e_namespace, NAME, {"prefill": {"resources": npu}})
        scenario.wait_ready(real_node, e2e_namespace, NAME, what="READY after the prefill rollout")
        wait_for(lambda: old not in {p["metadata"]["name"] for p in scenario.pods(real_node, e2e_namespace, NAME,
                                                                                  "prefill")},
                 180, "the old prefill pod to be gone", real_node)
        seen = client.oks()
        wait_for(lambda: client.oks() >= seen + 3, 120, "3 answers after the prefill rollout", real_node)
    print(f"prefill rollout: {len(client.results)} lines, {client.oks()} answered, {len(client.failures())} failed")
    assert client.failures() == [], f"{len(client.failures())} of {len(client.results)} requests failed: " + "\n".join(
        client.failures()[:10])


@REALNODE
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


@REALNODE
def test_delete_removes_every_pod_and_container(real_node: RealNodeCluster, served: dict, e2e_namespace: str) -> None:
    uids = scenario.delete_and_wait_gone(real_node, e2e_namespace, NAME)
    containerd = real_node.containerd
    assert containerd is not None

    def no_containers() -> bool:
        labels = [json.loads(containerd.ctr("containers", "info", c).stdout)["Labels"] for c in containerd.containers()]
        return not any(lab.get("io.kubernetes.pod.uid") in uids for lab in labels)

    wait_for(no_containers, 120, "containerd to drop the engine pods' containers", real_node)


# ---- kind (make e2e-kind; make test runs it after the suite) ------------------------------------------------
@pytest.fixture
def kind_cluster() -> Iterator[KindCluster]:
    with cleanup_on_signals():
        cluster = KindCluster().start()
        try:
            yield cluster
        finally:
            cluster.stop()
            assert cluster.name not in cluster.clusters(), f"kind cluster {cluster.name} was not deleted"


@pytest.mark.kind
def test_kind_install_serve_roll_and_delete(kind_cluster: KindCluster, request: pytest.FixtureRequest) -> None:
    """The real-node scenario on kind: install, decode + prefill serving through the Service, a decode rollout
    with a client looping inside the cluster and no failed request, delete and nothing left on the node."""
    operator: BuildResult = request.getfixturevalue("operator_image")  # tests/images' session fixtures
    engine: BuildResult = request.getfixturevalue("engine_image")
    client_image = base.base_image()  # python3 and a shell, for the looping client
    for node in kind_cluster.node_names():
        scenario.advertise_npus(kind_cluster, node)
    for image in (operator.tag, engine.tag, client_image):
        seconds = kind_cluster.load(image)
        print(f"kind load {image}: {daemon.image_size(image) / 2**20:.0f} MiB in {seconds:.1f}s")
    scenario.helm_install(kind_cluster, operator.tag, engine.tag)
    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    kind_cluster.kubectl("create", "namespace", namespace)

    kind_cluster.apply(scenario.atomdeployment(), "-n", namespace)
    status = scenario.wait_ready(kind_cluster, namespace, NAME)["status"]
    assert status["decode"]["summary"] == "1/1" and status["prefill"]["summary"] == "1/1"
    with scenario.openai_api(kind_cluster, namespace, NAME) as api:
        scenario.chat(api)
        model = api.models.list().data[0].id

    kind_cluster.apply(scenario.client_pod(client_image), "-n", namespace)
    wait_for(lambda: all(c["ready"] for c in kind_cluster.get("pod", "client", "-n", namespace)["status"].get(
        "containerStatuses", [{"ready": False}])), 180, "the client pod", kind_cluster)
    client = scenario.LoopingClient(kind_cluster, namespace, "client",
                                    f"http://{NAME}.{namespace}.svc:{scenario.HTTP_PORT}/v1/chat/completions", model)
    old = {p["metadata"]["name"] for p in scenario.running_pods(kind_cluster, namespace, NAME, "decode")}
    with client.running():
        wait_for(lambda: client.oks() >= 3, 180, "3 answers before the rollout", kind_cluster)
        scenario.patch_spec(kind_cluster, namespace, NAME, {"decode": {"lanes": 2, "kvBlocks": 4}})
        scenario.wait_ready(kind_cluster, namespace, NAME, what="READY after the lanes rollout")
        wait_for(lambda: not {p["metadata"]["name"] for p in scenario.pods(kind_cluster, namespace, NAME, "decode")}
                 & old, 240, "the old decode pod to be gone", kind_cluster)
        seen = client.oks()
        wait_for(lambda: client.oks() >= seen + 3, 180, "3 answers after the rollout", kind_cluster)
    print(f"lanes rollout on kind: {len(client.results)} lines, {client.oks()} answered, "
          f"{len(client.failures())} failed")
    assert client.failures() == [], f"{len(client.failures())} of {len(client.results)} requests failed: " + "\n".join(
        client.failures()[:10])

    uids = scenario.delete_and_wait_gone(kind_cluster, namespace, NAME)
    wait_for(lambda: not kind_cluster.pod_uids_with_containers() & uids, 120,
             "the nodes' containerd to drop the engine pods' containers", kind_cluster)
    scenario.helm_uninstall(kind_cluster)
