"""The desired children of an AtomDeployment, built without any API server."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from atom_engine.cpu_allowance import CPU_LIMIT_ENV, CPU_REQUEST_ENV
from atom_engine.settings import EngineSettings
from atom_operator.api import AtomDeploymentSpec
from atom_operator.children import Defaults, Owner, build_children
from atom_operator.children.meta import APPLIED_HASH, ARTIFACT_KEY, CONFIG_HASH, DEPLOYMENT_LABEL
from atom_operator.children.workload import engine_command
from atom_operator.npu import NpuProfile

DEFAULTS = Defaults(image="example.invalid/atom-engine:test", image_pull_policy="Never")


def owner(**spec) -> Owner:
    body = {"model": {"source": "builtin:tiny"}, **spec}
    return Owner("llm", "ns", "uid-1", AtomDeploymentSpec.model_validate(body, strict=False))


def by_kind(o: Owner) -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["metadata"]["name"]): c for c in build_children(o, DEFAULTS).desired}


PD = {
    "decode": {"replicas": 2, "npusPerReplica": 4, "lanes": 1, "kvBlocks": 3, "localPrefill": False},
    "prefill": {"replicas": 1, "backend": "rngd", "npusPerReplica": 2, "prefetchNext": True},
}


def test_decode_only_has_config_service_and_deployment_and_no_prefill() -> None:
    children = build_children(owner(), DEFAULTS)
    assert [(c["kind"], c["metadata"]["name"]) for c in children.desired] == [
        ("ConfigMap", "llm-decode-config"),
        ("Service", "llm"),
        ("Deployment", "llm-decode"),
    ]
    assert children.absent == [
        ("Job", "llm-decode-build"),  # no compile cache, no compile Job
        ("Deployment", "llm-prefill"),
        ("Service", "llm-prefill"),
        ("ConfigMap", "llm-prefill-config"),
        ("Job", "llm-prefill-build"),
    ]


def test_pd_has_every_child_in_apply_order() -> None:
    assert list(by_kind(owner(**PD))) == [
        ("ConfigMap", "llm-decode-config"),
        ("ConfigMap", "llm-prefill-config"),
        ("Service", "llm"),
        ("Service", "llm-prefill"),
        ("Deployment", "llm-prefill"),
        ("Deployment", "llm-decode"),
    ]
    assert build_children(owner(**PD), DEFAULTS).absent == [("Job", "llm-decode-build"), ("Job", "llm-prefill-build")]


def test_every_child_is_labelled_and_controlled_by_the_atomdeployment() -> None:
    for (_, name), child in by_kind(owner(**PD)).items():
        meta = child["metadata"]
        assert meta["namespace"] == "ns"
        assert meta["labels"]["app.kubernetes.io/name"] == "atom-engine"
        assert meta["labels"]["app.kubernetes.io/instance"] == "llm"
        assert meta["labels"][DEPLOYMENT_LABEL] == "llm"
        assert meta["labels"]["app.kubernetes.io/component"] == ("prefill" if "prefill" in name else "decode")
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "serving.atom.dev/v1alpha1",
                "kind": "AtomDeployment",
                "name": "llm",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert len(meta["annotations"][APPLIED_HASH]) == 16


def test_decode_pods_request_atom_npus_on_atom_nodes_with_the_users_placement() -> None:
    o = owner(
        decode={
            "replicas": 3,
            "npusPerReplica": 4,
            "nodeSelector": {"pool": "llm", "rebellions.ai/npu.present": "false"},
            "tolerations": [{"key": "npu", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
            "resources": {"limits": {"memory": "16Gi"}, "requests": {"cpu": 2}},
        }
    )
    dep = by_kind(o)[("Deployment", "llm-decode")]
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "atom-engine",
        "app.kubernetes.io/instance": "llm",
        "app.kubernetes.io/component": "decode",
    }
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"] == {"limits": {"memory": "16Gi", "rebellions.ai/npu": "4"}, "requests": {"cpu": "2"}}
    assert pod["nodeSelector"] == {"pool": "llm", "rebellions.ai/npu.present": "true"}
    assert pod["tolerations"] == [{"key": "npu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["affinity"] == {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert c["command"] == engine_command("decode") == [
        "atom-engine", "serve", "--role", "decode", "--config", "/etc/atom/engine.yaml", "--port", "8000",
        "--metrics-port", "9090",
    ]  # fmt: skip
    assert c["image"] == "example.invalid/atom-engine:test" and c["imagePullPolicy"] == "Never"
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("http", 8000), ("metrics", 9090)]
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def test_pods_meet_the_restricted_pod_security_profile() -> None:
    pod = by_kind(owner())[("Deployment", "llm-decode")]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert {"name": "scratch", "emptyDir": {}} in pod["volumes"]
    assert {"name": "scratch", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {"name": "config", "configMap": {"name": "llm-decode-config"}} in pod["volumes"]


def test_the_model_volume_is_mounted_read_only_where_source_points() -> None:
    o = owner(model={"source": "/models/llama", "volume": {"persistentVolumeClaim": {"claimName": "weights"}}})
    pod = by_kind(o)[("Deployment", "llm-decode")]["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights"}} in pod["volumes"]
    assert {"name": "model", "mountPath": "/models/llama", "readOnly": True} in pod["containers"][0]["volumeMounts"]


def test_rngd_prefill_requests_rngd_on_rngd_nodes_and_runs_the_prefill_role() -> None:
    kids = by_kind(owner(**PD, image="example.invalid/my-engine:1"))
    dep = kids[("Deployment", "llm-prefill")]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert dep["spec"]["replicas"] == 1
    assert c["resources"]["limits"]["furiosa.ai/rngd"] == "2"
    assert pod["nodeSelector"] == {"furiosa.ai/npu.family": "rngd"}
    assert c["command"][2:4] == ["--role", "prefill"]
    # furiosa-torch pins its own torch: rngd pods run the engine-rngd image, whatever spec.image says for the rest.
    assert c["image"] == DEFAULTS.rngd_image
    assert kids[("Deployment", "llm-decode")]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "example.invalid/my-engine:1"
    )
    # The device string comes from npusPerReplica: the engine drives that many RNGDs (furiosa:0..n-1).
    settings = yaml.safe_load(kids[("ConfigMap", "llm-prefill-config")]["data"]["engine.yaml"])
    assert settings["numDevices"] == 2 and settings["backend"] == "rngd"


def test_only_rngd_pods_get_the_io_uring_seccomp_profile_and_both_stay_restricted() -> None:
    kids = by_kind(owner(**PD))
    for role, want in (
        ("prefill", {"type": "Localhost", "localhostProfile": "atom/rngd-io-uring.json"}),
        ("decode", {"type": "RuntimeDefault"}),
    ):
        pod = kids[("Deployment", f"llm-{role}")]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert pod["securityContext"]["seccompProfile"] == want == c["securityContext"]["seccompProfile"], role
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False and pod["securityContext"]["runAsNonRoot"]
    # A cluster whose runtime default allows io_uring can keep RuntimeDefault for RNGD pods too.
    plain = replace(DEFAULTS, npu=NpuProfile(rngd={"seccompProfile": ""}))
    prefill = next(c for c in build_children(owner(**PD), plain).desired if c["metadata"]["name"] == "llm-prefill"
                   and c["kind"] == "Deployment")
    assert prefill["spec"]["template"]["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_a_roles_own_image_wins() -> None:
    spec = {**PD, "prefill": {**PD["prefill"], "image": "example.invalid/rngd:2"}, "image": "example.invalid/e:1"}
    kids = by_kind(owner(**{**spec, "decode": {**PD["decode"], "image": "example.invalid/decode:3"}}))
    images = {r: kids[("Deployment", f"llm-{r}")]["spec"]["template"]["spec"]["containers"][0]["image"]
              for r in ("decode", "prefill")}
    assert images == {"decode": "example.invalid/decode:3", "prefill": "example.invalid/rngd:2"}


def test_cpu_backend_requests_no_npu_and_needs_no_npu_node() -> None:
    o = owner(decode={"backend": "cpu", "npusPerReplica": 0})
    pod = by_kind(o)[("Deployment", "llm-decode")]["spec"]["template"]["spec"]
    assert set(pod["containers"][0]["resources"]["limits"]) == {"memory"}  # no NPU, only the sized default
    assert "nodeSelector" not in pod
    settings = yaml.safe_load(by_kind(o)[("ConfigMap", "llm-decode-config")]["data"]["engine.yaml"])
    assert settings["numDevices"] == 1  # the engine's default; the cpu backend ignores it


def test_decode_settings_name_the_headless_prefill_service() -> None:
    children = by_kind(owner(**PD))
    decode = yaml.safe_load(children[("ConfigMap", "llm-decode-config")]["data"]["engine.yaml"])
    prefill = yaml.safe_load(children[("ConfigMap", "llm-prefill-config")]["data"]["engine.yaml"])
    assert decode["prefillWorkers"] == "llm-prefill.ns.svc:8001"  # the workers' KV port (pdKvPort)
    assert decode["localPrefill"] is False and decode["prefetchNext"] is True and decode["backend"] == "atom"
    assert decode["remotePrefillMinTokens"] == prefill["remotePrefillMinTokens"] == 512  # the engine's default
    assert "prefillWorkers" not in prefill and prefill["backend"] == "rngd"
    assert EngineSettings.model_validate(decode).lanes == 1
    headless = children[("Service", "llm-prefill")]
    assert headless["spec"]["clusterIP"] == "None"
    assert {p["name"]: (p["port"], p["targetPort"]) for p in headless["spec"]["ports"]} == {
        "http": (8000, "http"), "kv": (8001, "kv")}
    ports = {p["name"]: p["containerPort"]
             for p in children[("Deployment", "llm-prefill")]["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports == {"http": 8000, "metrics": 9090, "kv": EngineSettings().pd_kv_port}
    assert headless["spec"]["selector"]["app.kubernetes.io/component"] == "prefill"


def test_the_service_selects_decode_pods_with_the_specs_type_and_port() -> None:
    svc = by_kind(owner(service={"type": "NodePort", "port": 8080}))[("Service", "llm")]
    assert svc["spec"]["type"] == "NodePort"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "decode"


def config_hashes(spec: dict) -> dict[str, str]:
    kids = by_kind(owner(**spec))
    return {r: kids[("Deployment", f"llm-{r}")]["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH]
            for r in ("decode", "prefill")}


def test_a_decode_only_change_rolls_decode_and_not_prefill() -> None:
    # lanes and kvBlocks shape decode's graphs and cache only; the prefill pods must keep serving unchanged.
    before = config_hashes({**PD, "decode": {**PD["decode"], "lanes": 2, "kvBlocks": 4}, "prefill": {
        **PD["prefill"], "prefetchNext": False}})
    after = config_hashes({**PD, "decode": {**PD["decode"], "lanes": 4, "kvBlocks": 8}, "prefill": {
        **PD["prefill"], "prefetchNext": False}})
    assert before["decode"] != after["decode"]
    assert before["prefill"] == after["prefill"]


def test_prefill_pods_compile_one_lane_and_one_block_beside_scratch() -> None:
    kids = by_kind(owner(**{**PD, "decode": {**PD["decode"], "lanes": 1, "kvBlocks": 9}}))
    prefill = EngineSettings.model_validate(yaml.safe_load(kids[("ConfigMap", "llm-prefill-config")]["data"][
        "engine.yaml"]))
    assert (prefill.lanes, prefill.kv_blocks, prefill.prefix_cache) == (1, 2, False)


def test_a_shared_change_rolls_both_roles() -> None:
    longer = {**PD, "model": {"source": "builtin:tiny", "maxSeqLen": 1024}}
    before, after = config_hashes(PD), config_hashes(longer)
    assert before["decode"] != after["decode"] and before["prefill"] != after["prefill"]


def test_a_single_replica_role_surges_and_a_larger_one_replaces_in_place() -> None:
    kids = by_kind(owner(**PD))  # decode 2 replicas, prefill 1
    decode = kids[("Deployment", "llm-decode")]["spec"]["strategy"]
    prefill = kids[("Deployment", "llm-prefill")]["spec"]["strategy"]
    # One prefill pod: the new one comes up beside it, so some worker answers throughout the rollout.
    assert prefill == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # Two decode pods on full NPU nodes: one at a time in place; the other serves meanwhile.
    assert decode == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    one = by_kind(owner(**{**PD, "decode": {**PD["decode"], "replicas": 1}}))[("Deployment", "llm-decode")]
    assert one["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_the_grace_period_covers_the_engines_drain_and_finish() -> None:
    pod = by_kind(owner(**PD))[("Deployment", "llm-decode")]["spec"]["template"]["spec"]
    defaults = EngineSettings()
    assert pod["terminationGracePeriodSeconds"] > defaults.drain_seconds + defaults.finish_seconds


def test_building_is_deterministic() -> None:
    assert build_children(owner(**PD), DEFAULTS) == build_children(owner(**PD), DEFAULTS)


LEGACY = NpuProfile(
    atom={"resource": "rebellions.ai/ATOM", "nodeSelector": {"rebellions.ai/npu.present": "true"}},
    rngd={"resource": "furiosa.ai/rngd-2core.12gb", "nodeSelector": {"furiosa.ai/npu.product": "rngd-max"}},
)


# One 2-core partition a prefill pod (two could be parts of two cards: atom_operator.npu.rngd_pes).
PD_PARTITIONED = {**PD, "prefill": {**PD["prefill"], "npusPerReplica": 1}}


def test_pods_request_the_clusters_resource_names_and_select_its_labels() -> None:
    kids = build_children(owner(**PD_PARTITIONED), replace(DEFAULTS, npu=LEGACY)).desired
    pods = {c["metadata"]["name"]: c["spec"]["template"]["spec"] for c in kids if c["kind"] == "Deployment"}
    decode, prefill = pods["llm-decode"], pods["llm-prefill"]
    npus = {r: q for r, q in decode["containers"][0]["resources"]["limits"].items() if "/" in r}
    assert npus == {"rebellions.ai/ATOM": "4"}
    assert decode["nodeSelector"] == {"rebellions.ai/npu.present": "true"}
    npus = {r: q for r, q in prefill["containers"][0]["resources"]["limits"].items() if "/" in r}
    assert npus == {"furiosa.ai/rngd-2core.12gb": "1"}
    assert prefill["nodeSelector"] == {"furiosa.ai/npu.product": "rngd-max"}
    # The default profile names neither: one source of truth decides, nothing else spells a resource name.
    default = by_kind(owner(**PD))[("Deployment", "llm-decode")]["spec"]["template"]["spec"]
    npus = {r: q for r, q in default["containers"][0]["resources"]["limits"].items() if "/" in r}
    assert npus == {"rebellions.ai/npu": "4"}


def test_an_rngd_engine_fuses_the_pes_its_pod_is_given() -> None:
    def engine_yaml(spec: dict, profile: NpuProfile) -> dict:
        kids = build_children(owner(**spec), replace(DEFAULTS, npu=profile)).desired
        [config] = [c for c in kids if c["metadata"]["name"] == "llm-prefill-config"]
        return yaml.safe_load(config["data"]["engine.yaml"])

    # A 2-core partition: its 2 PEs (compiled graphs are bound to the fusion, and the card has no more for the pod).
    partitioned = engine_yaml(PD_PARTITIONED, LEGACY)
    assert partitioned["rngdPes"] == 2 and partitioned["numDevices"] == 1
    # Whole cards: unset, so the engine fuses the 8 PEs of each of its numDevices cards.
    whole = engine_yaml(PD, NpuProfile())
    assert "rngdPes" not in whole and whole["numDevices"] == 2
    # Two partitions cannot be one device: the webhook refuses it (tests/api), and building says why.
    with pytest.raises(ValueError, match="a partition of an RNGD card: npusPerReplica must be 1"):
        engine_yaml(PD, LEGACY)


def test_network_policies_let_clients_reach_decode_and_only_decode_reach_prefill() -> None:
    with_policy = Defaults(image="example.invalid/atom-engine:test", network_policy=True)
    children = build_children(owner(**PD), with_policy)
    policies = {c["metadata"]["name"]: c["spec"] for c in children.desired if c["kind"] == "NetworkPolicy"}
    assert set(policies) == {"llm", "llm-prefill"}
    decode, prefill = policies["llm"], policies["llm-prefill"]
    assert decode["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "decode"
    assert all("from" not in rule for rule in decode["ingress"])  # any client
    http = next(r for r in prefill["ingress"] if {"port": 8000, "protocol": "TCP"} in r["ports"])
    assert http["ports"] == [{"port": 8000, "protocol": "TCP"}, {"port": 8001, "protocol": "TCP"}]  # HTTP, KV
    assert http["from"] == [{"podSelector": {"matchLabels": decode["podSelector"]["matchLabels"]}}]
    assert not any(c["kind"] == "NetworkPolicy" for c in build_children(owner(**PD), DEFAULTS).desired)
    assert ("NetworkPolicy", "llm-prefill") in build_children(owner(), with_policy).absent


CACHE = {"persistentVolumeClaim": {"claimName": "compiled"}}


def test_a_compile_cache_makes_one_compile_job_per_role_and_holds_the_pods_back_until_it_succeeded() -> None:
    o = owner(**PD, model={"source": "builtin:tiny", "compileCache": CACHE})
    first = build_children(o, DEFAULTS)
    jobs = {c["metadata"]["name"]: c for c in first.desired if c["kind"] == "Job"}
    assert sorted(jobs) == ["llm-decode-build", "llm-prefill-build"]
    assert not [c for c in first.desired if c["kind"] == "Deployment"]
    assert sorted(first.withheld) == [("Deployment", "llm-decode"), ("Deployment", "llm-prefill")]
    job = jobs["llm-decode-build"]
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["atom-engine", "compile", "--config", "/etc/atom/engine.yaml"]
    assert pod["restartPolicy"] == "Never" and c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert not [r for r in c.get("resources", {}).get("limits", {}) if "/" in r]  # no NPU held by a compile
    assert {"name": "compile-cache", **CACHE} in pod["volumes"]
    assert {"name": "compile-cache", "mountPath": "/var/cache/atom/compiled"} in c["volumeMounts"]
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [2, 3]  # retrying cannot help
    assert job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "decode-build"
    # The rngd role compiles in its own image, on its own nodes.
    rngd = jobs["llm-prefill-build"]["spec"]["template"]["spec"]
    assert rngd["containers"][0]["image"] == DEFAULTS.rngd_image and rngd["nodeSelector"] == {
        "furiosa.ai/npu.family": "rngd"
    }
    keys = {j["metadata"]["annotations"][ARTIFACT_KEY] for j in jobs.values()}
    later = build_children(o, DEFAULTS, built=keys)
    deployments = {c["metadata"]["name"]: c for c in later.desired if c["kind"] == "Deployment"}
    assert sorted(deployments) == ["llm-decode", "llm-prefill"] and later.withheld == []
    pod = deployments["llm-decode"]["spec"]["template"]["spec"]
    assert {"name": "compile-cache", "mountPath": "/var/cache/atom/compiled", "readOnly": True} in (
        pod["containers"][0]["volumeMounts"]
    )
    settings = yaml.safe_load(next(c for c in later.desired if c["kind"] == "ConfigMap")["data"]["engine.yaml"])
    assert settings["compileCacheDir"] == "/var/cache/atom/compiled"


def test_the_artifact_key_follows_the_settings_and_the_image() -> None:
    def key(**spec) -> str:
        o = owner(**{"model": {"source": "builtin:tiny", "compileCache": CACHE}, **spec})
        (job,) = [c for c in build_children(o, DEFAULTS).desired if c["kind"] == "Job"]
        return job["metadata"]["annotations"][ARTIFACT_KEY]

    base = key()
    assert key() == base
    assert key(decode={"lanes": 2, "kvBlocks": 4}) != base
    assert key(image="example.invalid/other:1") != base
    assert key(decode={"tolerations": [{"key": "npu", "operator": "Exists"}]}) == base  # placement is not the artifact


def test_engine_pods_get_their_cpu_limit_and_request_and_the_roles_cpu_threads() -> None:
    kids = by_kind(owner(**{**PD, "decode": {**PD["decode"], "cpuThreads": 3}}))
    for role in ("decode", "prefill"):
        container = kids[("Deployment", f"llm-{role}")]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("valueFrom", {}).get("resourceFieldRef") for e in container["env"]}
        # The engine sizes its threads from these (atom_engine.cpu_allowance), in millicores.
        assert env[CPU_LIMIT_ENV] == {"containerName": container["name"], "resource": "limits.cpu", "divisor": "1m"}
        assert env[CPU_REQUEST_ENV] == {"containerName": container["name"], "resource": "requests.cpu",
                                        "divisor": "1m"}
    decode = yaml.safe_load(kids[("ConfigMap", "llm-decode-config")]["data"]["engine.yaml"])
    prefill = yaml.safe_load(kids[("ConfigMap", "llm-prefill-config")]["data"]["engine.yaml"])
    assert decode["cpuThreads"] == 3 and "cpuThreads" not in prefill  # unset: the engine reads the allowance


def test_selective_pd_renders_the_decode_pods_threshold_and_leaves_the_prefill_pods_alone() -> None:
    spec = {"decode": {"localPrefill": True, "remotePrefillMinTokens": 96}, "prefill": {"replicas": 1}}
    children = by_kind(owner(**spec))
    decode = yaml.safe_load(children[("ConfigMap", "llm-decode-config")]["data"]["engine.yaml"])
    prefill = yaml.safe_load(children[("ConfigMap", "llm-prefill-config")]["data"]["engine.yaml"])
    assert decode["localPrefill"] is True and decode["remotePrefillMinTokens"] == 96
    assert decode["prefillWorkers"] == "llm-prefill.ns.svc:8001"
    assert prefill["remotePrefillMinTokens"] == EngineSettings().remote_prefill_min_tokens  # no roll of prefill pods
