"""Compiled artifacts on a volume (spec.model.compileCache): one compile Job, pods only after it, a mismatch named.

kwok's pods run nothing, so this test runs the containers itself, exactly as their pod specs say (command, args,
the rendered settings), as local processes sharing one directory: the PersistentVolume's hostPath, where the
claim the AtomDeployment names is bound. For the compile Job's pod it then does what a kubelet does: it writes
the container's exit code and termination message (terminationMessagePolicy FallbackToLogsOnError: the log's
tail, since /dev/termination-log does not exist here) into the pod's status, and the Job controller takes it from
there. The serving pods' logs are read for event=artifact_loaded.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from atom_localcluster.cluster import free_port
from atom_localcluster.wait import wait_for
from atom_operator.api.spec import COMPILE_CACHE_PATH

from tests.operator.test_reconciler import condition, create, get, pods, ready

pytestmark = pytest.mark.cluster
BIN = Path(sys.executable).parent
LOG_TAIL_BYTES = 2048  # the kubelet's FallbackToLogsOnError keeps at most the last 2048 bytes / 80 lines


@pytest.fixture
def claim(cluster, namespace: str) -> Iterator[Callable[[Path], dict]]:
    """A PersistentVolume on a local path bound to the claim ``compiled``: a compile cache as a cluster has one."""
    pv = f"compiled-{namespace}"
    yield lambda path: _bind(cluster, namespace, pv, path)
    cluster.kubectl("delete", "pv", pv, "--wait=false", check=False)  # cluster-scoped: the namespace keeps none


def _bind(cluster, namespace: str, pv: str, path: Path) -> dict:
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "hostPath": {"path": str(path)},
                    "claimRef": {"namespace": namespace, "name": "compiled"},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "compiled", "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        ]
    )
    wait_for(
        lambda: cluster.get("pvc", "compiled", "-n", namespace)["status"].get("phase") == "Bound", "the claim bound"
    )
    return {"persistentVolumeClaim": {"claimName": "compiled"}}


def local_config(cluster, namespace: str, pod: dict, cache: Path, workdir: Path) -> Path:
    """The pod's rendered settings, with the volume's mount point replaced by where the volume lives here."""
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "config")
    data = cluster.get("configmap", volume["configMap"]["name"], "-n", namespace)["data"]
    settings = yaml.safe_load(next(iter(data.values())))
    assert settings["compileCacheDir"] == COMPILE_CACHE_PATH
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "compile-cache")
    assert mount["mountPath"] == COMPILE_CACHE_PATH
    settings["compileCacheDir"] = str(cache)
    path = workdir / f"{pod['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def argv_of(pod: dict, config: Path, port: int | None = None) -> list[str]:
    container = pod["spec"]["containers"][0]
    argv = container["command"] + container.get("args", [])
    out = [str(BIN / argv[0])]
    for prev, arg in zip(argv, argv[1:], strict=False):
        out.append(
            str(config)
            if prev == "--config"
            else str(port)
            if prev == "--port"
            else str(free_port())
            if prev == "--metrics-port"
            else arg
        )
    return out + (["--host", "127.0.0.1"] if port else [])


def compile_pod(cluster, namespace: str) -> dict:
    def running():
        found = pods(cluster, namespace, "decode-build")
        return found[0] if found and found[0]["status"].get("phase") == "Running" else None

    return wait_for(running, "the compile Job's pod")


def run_compile_pod_as_a_kubelet(cluster, namespace: str, cache: Path, workdir: Path) -> subprocess.CompletedProcess:
    pod = compile_pod(cluster, namespace)
    container = pod["spec"]["containers"][0]
    assert container["command"][:2] == ["atom-engine", "compile"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    config = local_config(cluster, namespace, pod, cache, workdir)
    done = subprocess.run(argv_of(pod, config), capture_output=True, text=True, timeout=300, cwd=workdir)
    logs = (done.stdout + done.stderr)[-LOG_TAIL_BYTES:]
    terminated = {
        "exitCode": done.returncode,
        "reason": "Completed" if done.returncode == 0 else "Error",
        "startedAt": pod["status"]["startTime"],
        "finishedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if done.returncode:
        terminated["message"] = "\n".join(logs.splitlines()[-80:])
    patch = {
        "status": {
            "phase": "Succeeded" if done.returncode == 0 else "Failed",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
            "containerStatuses": [
                {
                    "name": "engine",
                    "image": container["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
    }
    out = cluster.kubectl(
        "patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(patch), check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return done


@contextlib.contextmanager
def serving(cluster, namespace: str, cache: Path, workdir: Path) -> Iterator[list[Path]]:
    """Every decode pod as a local engine process, as its pod spec says; yields their log files once all are ready."""
    procs, logs = [], []
    try:
        for pod in pods(cluster, namespace, "decode"):
            port = free_port()
            config = local_config(cluster, namespace, pod, cache, workdir)
            log = workdir / f"{pod['metadata']['name']}.log"
            with open(log, "wb") as out:
                procs.append(
                    subprocess.Popen(
                        argv_of(pod, config, port), stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                        start_new_session=True,
                    )  # fmt: skip
                )
            logs.append((log, port, procs[-1]))
        for log, port, proc in logs:
            wait_for(lambda p=port, pr=proc, lg=log: _ready(p, pr, lg), f"engine on :{port}", timeout=240)
        yield [log for log, _, _ in logs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
            if p.poll() is None:
                p.kill()


def _ready(port: int, proc: subprocess.Popen, log: Path) -> bool:
    assert proc.poll() is None, f"engine exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


CPU = {"backend": "cpu", "npusPerReplica": 0, "lanes": 2, "kvBlocks": 4}


def test_three_replicas_compile_once_and_load_the_artifact(cluster, op, namespace, claim, tmp_path) -> None:
    cache = tmp_path / "volume"
    cache.mkdir()
    create(cluster, namespace, model={"source": "builtin:tiny", "compileCache": claim(cache)},
           decode={**CPU, "replicas": 3})  # fmt: skip
    compile_pod(cluster, namespace)
    # Before the artifact exists, no serving pod does.
    assert not cluster.get("deployments", "-n", namespace)["items"]
    obj = get(cluster, namespace)
    assert condition(obj, "ArtifactReady")["status"] == "False" and obj["status"]["artifact"] == "Compiling"

    done = run_compile_pod_as_a_kubelet(cluster, namespace, cache, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "event=artifact_compiled" in done.stderr

    obj = wait_for(lambda: ready(cluster, namespace), "Ready once the artifact is built")
    assert condition(obj, "ArtifactReady")["status"] == "True" and obj["status"]["artifact"] == "Ready"
    jobs = cluster.get("jobs", "-n", namespace)["items"]
    assert [j["metadata"]["name"] for j in jobs] == ["llm-decode-build"] and jobs[0]["status"]["succeeded"] == 1
    printed = cluster.kubectl("get", "atomdeployments", "-n", namespace).stdout
    assert printed.split("\n")[0].split()[6] == "ARTIFACT" and printed.split("\n")[1].split()[6] == "Ready"
    replicas = pods(cluster, namespace, "decode")
    assert len(replicas) == 3
    for p in replicas:
        mount = next(m for m in p["spec"]["containers"][0]["volumeMounts"] if m["name"] == "compile-cache")
        assert mount["readOnly"] is True  # the Job is the only writer

    keys = [d.name for d in cache.iterdir()]
    with serving(cluster, namespace, cache, tmp_path) as logs:
        for log in logs:
            text = log.read_text()
            assert f"event=artifact_loaded key={keys[0]}" in text, text[-2000:]
            assert "event=artifact_compiled" not in text
    assert [d.name for d in cache.iterdir()] == keys  # one artifact, compiled once
    # One Job, written once: never replaced (which would compile again) by a reconcile that saw the server's view.
    job_writes = [(w["verb"], w["objectRef"]["name"]) for w in op.writes(namespace)
                  if w["objectRef"].get("resource") == "jobs"]  # fmt: skip
    assert job_writes == [("patch", "llm-decode-build")], job_writes  # server-side apply creates with a patch


def test_a_mismatched_artifact_is_a_condition_naming_the_field_and_no_pod_starts(
    cluster, op, namespace, claim, tmp_path
) -> None:
    # A volume with a pre-built (pinned) artifact, compiled for 2 lanes elsewhere.
    cache = tmp_path / "volume"
    cache.mkdir()
    prebuilt = tmp_path / "prebuilt.yaml"
    prebuilt.write_text(yaml.safe_dump({"backend": "cpu", "lanes": 2, "kvBlocks": 4, "compileCacheDir": str(cache)}))
    made = subprocess.run([str(BIN / "atom-engine"), "compile", "--config", str(prebuilt)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    (keyed,) = cache.iterdir()
    for f in keyed.iterdir():
        f.rename(cache / f.name)
    keyed.rmdir()

    create(cluster, namespace, model={"source": "builtin:tiny", "compileCache": claim(cache)},
           decode={**CPU, "replicas": 2, "lanes": 4, "kvBlocks": 6})  # fmt: skip
    done = run_compile_pod_as_a_kubelet(cluster, namespace, cache, tmp_path)
    assert done.returncode == 3, done.stderr[-3000:]

    def mismatch():
        obj = get(cluster, namespace)
        return obj if condition(obj, "ArtifactReady").get("reason") == "ArtifactMismatch" else None

    obj = wait_for(mismatch, "ArtifactReady False with ArtifactMismatch")
    message = condition(obj, "ArtifactReady")["message"]
    assert "artifact mismatch: lanes: artifact has 2, settings have 4" in message, message
    assert condition(obj, "ArtifactReady")["status"] == "False" and obj["status"]["artifact"] == "Mismatch"
    assert condition(obj, "Degraded")["status"] == "True" and "lanes" in condition(obj, "Degraded")["message"]
    assert condition(obj, "Ready")["status"] == "False"
    job = cluster.get("job", "llm-decode-build", "-n", namespace)
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"]["conditions"])
    # No pod loads the mismatched artifact: the role's Deployment never came.
    assert not cluster.get("deployments", "-n", namespace)["items"] and not pods(cluster, namespace, "decode")
