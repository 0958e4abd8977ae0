"""``AtomDeployment.spec``: what a user writes, with the engine's limits enforced on it."""

from __future__ import annotations

from typing import Literal

from atom_engine import limits
from atom_engine.dtypes import DeployableDType
from atom_engine.model.builtin import BUILTIN_MODELS, SOURCE_PATTERN
from atom_engine.settings import EngineSettings, Role
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from atom_operator.api import rules
from atom_operator.api.autoscaling import AutoscalingSpec
from atom_operator.api.fields import FreeForm, LabelMap, Resources, Strict, Toleration

# The engine's own defaults are the spec's defaults: one place decides what an unconfigured engine runs with.
_ENGINE = EngineSettings.model_fields

# Where spec.model.compileCache is mounted in every pod: the engine settings' compileCacheDir.
COMPILE_CACHE_PATH = "/var/cache/atom/compiled"


class ModelSpec(Strict):
    """The model the deployment serves."""

    name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="Model id served on /v1/models and accepted in requests; defaults to the object's name.",
    )
    source: str = Field(
        max_length=4096,
        pattern=SOURCE_PATTERN,
        description="A built-in model ("
        + "; ".join(f"{m.source}: {m.description}" for m in BUILTIN_MODELS.values())
        + "), or the absolute path of a Hugging Face-layout checkpoint (safetensors) inside the pod, usually where"
        " `volume` is mounted.",
    )
    volume: FreeForm | None = Field(
        None,
        description="A core/v1 volume source (e.g. persistentVolumeClaim, hostPath, image) mounted read-only at"
        " `source`.",
    )
    compile_cache: FreeForm | None = Field(
        None,
        description="A core/v1 volume source (typically a persistentVolumeClaim; ReadWriteMany when replicas run on"
        " several nodes) where compiled graphs are kept, mounted at " + COMPILE_CACHE_PATH + " (the engine's"
        " compileCacheDir). The operator compiles once per artifact in a Job (<name>-<role>-build) and starts the"
        " role's pods only after it succeeded; they load the artifact read-only. A volume holding a pre-built"
        " artifact (manifest.json at its root) is verified against this spec instead. Unset: every pod compiles at"
        " start.",
    )
    max_seq_len: int = Field(
        _ENGINE["max_seq_len"].default,
        ge=limits.MAX_SEQ_LEN_MIN,
        le=limits.MAX_SEQ_LEN_MAX,
        description="Longest sequence (prompt + generated tokens) one KV block holds; compiled into the graphs."
        f" {limits.MAX_SEQ_LEN_MIN}..{limits.MAX_SEQ_LEN_MAX}.",
    )
    dtype: DeployableDType | None = Field(
        None,
        description="Precision of the weights and the KV cache, the same in every role (the KV crosses from prefill"
        " to decode pods). Default: bfloat16 when a role runs on an NPU backend (ATOM and RNGD run half"
        " precision), else float32.",
    )


def prefill_role(spec: AtomDeploymentSpec) -> bool:
    """Whether the deployment has prefill workers: replicas >= 1, or autoscaled (then the role exists at any count,
    so no decision ever changes the decode pods' settings and rolls them)."""
    return spec.prefill.replicas >= 1 or (spec.autoscaling is not None and spec.autoscaling.prefill is not None)


def model_dtype(spec: AtomDeploymentSpec) -> str:
    """``spec.model.dtype``, else bfloat16 when any role that runs uses an NPU backend, else float32."""
    if spec.model.dtype is not None:
        return spec.model.dtype
    backends = [spec.decode.backend] + ([spec.prefill.backend] if prefill_role(spec) else [])
    return "bfloat16" if any(b in limits.NPU_BACKENDS for b in backends) else "float32"


class _Placement(Strict):
    image: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="Engine image of this role's pods; defaults to spec.image for the atom and cpu backends, and to"
        " the operator's engine-rngd image for rngd (furiosa-torch pins its own torch, so rngd has an image of its"
        " own).",
    )
    resources: Resources | None = Field(None, description="Extra container resources (cpu, memory).")
    node_selector: LabelMap | None = Field(
        None, description="Node labels the pods require, merged with the NPU family's own selector."
    )
    tolerations: list[Toleration] | None = Field(
        None, max_length=32, description="Taints the pods tolerate, e.g. a dedicated NPU node pool's."
    )
    affinity: FreeForm | None = Field(None, description="A core/v1 Affinity for the pods.")
    cpu_threads: int | None = Field(
        None,
        ge=limits.CPU_THREADS_MIN,
        le=limits.CPU_THREADS_MAX,
        description="The engine's intra-op CPU threads (torch). Unset: the CPUs the container may use (its CPU"
        " limit, request and cgroup quota, which the operator passes to the engine), never the node's core count."
        f" {limits.CPU_THREADS_MIN}..{limits.CPU_THREADS_MAX}.",
    )


class DecodeSpec(_Placement):
    """The decode role: the pods behind the OpenAI endpoint, batching requests in lanes."""

    replicas: int = Field(
        1, ge=rules.REPLICAS_MIN, le=rules.REPLICAS_MAX, description="Decode pods; `kubectl scale` sets this."
    )
    backend: Literal[limits.DECODE_BACKENDS] = Field(
        "atom", json_schema_extra={"maxLength": 8}, description="Where decode runs: atom (Rebellions ATOM NPU) or cpu."
    )
    npus_per_replica: int = Field(
        1,
        ge=0,
        le=limits.NPUS_PER_REPLICA_MAX,
        description="NPUs each decode pod requests, under the cluster's resource name for ATOM (the operator's NPU"
        " profile: rebellions.ai/npu by default, rebellions.ai/ATOM with generic names off); >= 1 for atom, 0 for cpu.",
    )
    lanes: int = Field(
        _ENGINE["lanes"].default,
        ge=limits.LANES_MIN,
        le=limits.LANES_MAX,
        description="Decode batch slots of the compiled graph: this many requests decode together."
        f" {limits.LANES_MIN}..{limits.LANES_MAX}.",
    )
    kv_blocks: int = Field(
        _ENGINE["kv_blocks"].default,
        ge=limits.KV_BLOCKS_MIN,
        le=limits.KV_BLOCKS_MAX,
        description="KV-cache blocks compiled in; each holds one whole sequence of up to model.maxSeqLen tokens."
        " One is the scratch block and each active lane holds one, so at least lanes + 1, and lanes + 2 with"
        f" prefixCache (the copy source of a prefix hit). At most {limits.KV_BLOCKS_MAX}.",
    )
    prefix_cache: bool = Field(
        _ENGINE["prefix_cache"].default,
        description="Keep finished sequences' blocks as an LRU prefix cache; a prompt sharing a cached prefix only"
        " prefills the rest. Needs kvBlocks >= lanes + 2.",
    )
    local_prefill: bool = Field(
        _ENGINE["local_prefill"].default,
        description="Decode pods may prefill prompts themselves; false makes them remote-only (every prompt is"
        " prefilled by a prefill worker), which needs prefill.replicas >= 1.",
    )
    remote_prefill_min_tokens: int = Field(
        _ENGINE["remote_prefill_min_tokens"].default,
        ge=0,
        le=limits.REMOTE_PREFILL_MIN_TOKENS_MAX,
        description="Selective disaggregation, with localPrefill true and prefill.replicas >= 1: a prompt whose"
        " uncached suffix has at least this many tokens is prefilled by a prefill worker, a shorter one by the"
        " decode pod itself (and every prompt while the prefill pool is unavailable). Remote-only decode pods"
        " (localPrefill false) send every prompt to the workers.",
    )
    speculative_tokens: int = Field(
        _ENGINE["speculative_tokens"].default,
        ge=0,
        le=limits.SPECULATIVE_TOKENS_MAX,
        description="Greedy requests: up to this many next tokens guessed from the request's own text (prompt"
        " lookup) and checked in the same decode step, so a lane can gain several tokens a step with the output"
        " unchanged. 0 turns it off. The cpu backend verifies drafts; atom's decode graph takes one token per lane"
        f" and decodes without them. 0..{limits.SPECULATIVE_TOKENS_MAX}.",
    )


class PrefillSpec(_Placement):
    """The prefill role: workers that compute prompts' KV and ship it to decode pods (PD disaggregation)."""

    replicas: int = Field(
        0, ge=rules.REPLICAS_MIN, le=rules.REPLICAS_MAX, description="Prefill worker pods; 0 = no prefill workers."
    )
    backend: Literal[limits.PREFILL_BACKENDS] = Field(
        "atom",
        json_schema_extra={"maxLength": 8},
        description="Where prefill runs: atom (Rebellions ATOM), rngd (FuriosaAI RNGD) or cpu.",
    )
    npus_per_replica: int = Field(
        1,
        ge=0,
        le=limits.NPUS_PER_REPLICA_MAX,
        description="NPUs each prefill pod requests, under the cluster's resource name for its backend (the"
        " operator's NPU profile: rebellions.ai/npu or rebellions.ai/ATOM; furiosa.ai/rngd or a partition such as"
        " furiosa.ai/rngd-2core.12gb); >= 1 for NPU backends, 0 for cpu.",
    )
    prefetch_next: bool = Field(
        _ENGINE["prefetch_next"].default,
        description="B1 prefetch: send the next queued prompt to a prefill worker while the single lane decodes."
        " Needs decode.lanes == 1, prefill.replicas >= 1 and decode.localPrefill false.",
    )


class ServiceSpec(Strict):
    """The Service in front of the decode pods: the OpenAI-compatible endpoint."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    port: int = Field(8000, ge=rules.PORT_MIN, le=rules.PORT_MAX, description="Service port of the endpoint.")


class GatewayRef(Strict):
    """A Gateway API Gateway that should route to the pool (an HTTPRoute is made for it)."""

    name: str = Field(min_length=1, max_length=253, description="The Gateway's name.")
    namespace: str | None = Field(
        None, min_length=1, max_length=63, description="The Gateway's namespace; defaults to the AtomDeployment's."
    )


class InferencePoolSpec(Strict):
    """The decode pods as a Gateway API Inference Extension InferencePool, routed by its endpoint picker."""

    enabled: bool = Field(
        False,
        description="Make an InferencePool (inference.networking.k8s.io/v1) of the decode pods and run its endpoint"
        " picker (<name>-epp): prefix-cache and load aware routing for gateways that support the extension. Needs"
        " the extension's CRDs in the cluster (else a condition says so); the Service stays as the plain path.",
    )
    gateway: GatewayRef | None = Field(
        None, description="Also route this Gateway's traffic to the pool with an HTTPRoute (Gateway API CRDs needed)."
    )


class RoutingSpec(Strict):
    """How requests reach the decode pods besides the Service."""

    # default {} (not absent), like the roles: the nested defaults are always there to read.
    inference_pool: InferencePoolSpec = Field(
        default_factory=InferencePoolSpec, json_schema_extra={"default": {}}, description=InferencePoolSpec.__doc__
    )


class AtomDeploymentSpec(Strict):
    """An LLM served by decode pods and optional prefill workers on NPU nodes."""

    model: ModelSpec = Field(description="The model to serve.")
    image: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="Engine image of the atom and cpu roles (a role's own image wins); defaults to the operator's"
        " configured image. rngd roles run the operator's engine-rngd image unless prefill.image says otherwise.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="Pull policy of the engine image; defaults to the operator's configuration."
    )
    # default {} (not absent) so that the CRD's CEL rules can always read the nested defaults.
    decode: DecodeSpec = Field(
        default_factory=DecodeSpec, json_schema_extra={"default": {}}, description=DecodeSpec.__doc__
    )
    prefill: PrefillSpec = Field(
        default_factory=PrefillSpec, json_schema_extra={"default": {}}, description=PrefillSpec.__doc__
    )
    service: ServiceSpec = Field(
        default_factory=ServiceSpec, json_schema_extra={"default": {}}, description=ServiceSpec.__doc__
    )
    routing: RoutingSpec = Field(
        default_factory=RoutingSpec, json_schema_extra={"default": {}}, description=RoutingSpec.__doc__
    )
    autoscaling: AutoscalingSpec | None = Field(None, description=AutoscalingSpec.__doc__)

    @model_validator(mode="after")
    def _limits(self) -> AtomDeploymentSpec:
        broken = [r for r in rules.RULES if not r.root and r.violated(self.view())]
        if broken:
            view = self.view()
            raise PydanticCustomError(
                "engine_limit",
                "{summary}",
                {
                    "summary": "; ".join(r.render(view) for r in broken),
                    "violations": tuple((f"spec.{r.field}", r.render(view)) for r in broken),
                },
            )
        return self

    def view(self, name: str | None = None) -> rules.SpecView:
        return rules.SpecView(
            lanes=self.decode.lanes,
            kv_blocks=self.decode.kv_blocks,
            prefix_cache=self.decode.prefix_cache,
            local_prefill=self.decode.local_prefill,
            prefetch_next=self.prefill.prefetch_next,
            prefill_replicas=self.prefill.replicas,
            decode_backend=self.decode.backend,
            decode_npus=self.decode.npus_per_replica,
            prefill_backend=self.prefill.backend,
            prefill_npus=self.prefill.npus_per_replica,
            name=name,
            autoscaling=self.autoscaling,
        )


# What a prefill worker compiles: one lane (its decode graph is never run) and one block beside the scratch block
# (PrefillWorker.compute holds one block at a time, under its lock; prefill workers run without a prefix cache).
PREFILL_LANES = 1
PREFILL_KV_BLOCKS = 2


def engine_settings(
    spec: AtomDeploymentSpec, role: Role, *, name: str, prefill_workers: str | None = None,
    rngd_pes: int | None = None,
) -> EngineSettings:
    """The settings one ``role`` pod of the deployment ``name`` runs with.

    ``prefill_workers`` is the host:port of the prefill Service; decode pods get it whenever prefill workers
    exist (it is required then), prefill pods never (they prefill locally and ship the KV). ``rngd_pes``: the PEs
    an rngd pod fuses, from the cluster's resource name (``atom_operator.npu.rngd_pes``; None: whole cards).
    """
    if role == "standalone":
        raise ValueError("an AtomDeployment runs decode and prefill pods, not standalone engines")
    if role == "decode" and prefill_role(spec) and not prefill_workers:
        raise ValueError("decode settings need prefill_workers (host:port) when prefill.replicas >= 1")
    decode = role == "decode"
    npus = (spec.decode if decode else spec.prefill).npus_per_replica
    return EngineSettings(
        model_name=spec.model.name or name,
        model_source=spec.model.source,
        max_seq_len=spec.model.max_seq_len,
        dtype=model_dtype(spec),
        backend=spec.decode.backend if decode else spec.prefill.backend,
        # A prefill worker never decodes and computes one prompt at a time into one block (plus the scratch
        # block); what it ships is shaped by the model and the prompt, not by decode's lanes or kvBlocks. Fixed
        # values keep decode-only changes (lanes, kvBlocks) from rolling the prefill pods too, and use less memory.
        lanes=spec.decode.lanes if decode else PREFILL_LANES,
        kv_blocks=spec.decode.kv_blocks if decode else PREFILL_KV_BLOCKS,
        prefix_cache=spec.decode.prefix_cache if decode else False,
        local_prefill=spec.decode.local_prefill if decode else True,
        remote_prefill_min_tokens=(spec.decode.remote_prefill_min_tokens if decode
                                   else _ENGINE["remote_prefill_min_tokens"].default),
        prefetch_next=spec.prefill.prefetch_next if decode else False,
        speculative_tokens=spec.decode.speculative_tokens if decode else 0,  # a prefill worker never decodes
        prefill_workers=prefill_workers if decode and prefill_role(spec) else None,
        # The NPUs the device plugin gives the pod: the engine drives that many (atom: /dev/rbln* it finds; rngd:
        # furiosa:0..n-1). A cpu role requests none and keeps the engine's default.
        num_devices=max(npus, 1),
        rngd_pes=rngd_pes,
        compile_cache_dir=COMPILE_CACHE_PATH if spec.model.compile_cache else None,
        cpu_threads=(spec.decode if decode else spec.prefill).cpu_threads,
    )
