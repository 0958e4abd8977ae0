"""What one engine process runs with. Torch-free: the operator renders it into each role's ConfigMap."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from atom_engine import limits
from atom_engine.dtypes import DTypeName
from atom_engine.model.chat_templates import CHAT_TEMPLATES

Role = Literal["standalone", "decode", "prefill"]


class EngineSettings(BaseModel):
    """Engine settings, keyed as in ``AtomDeployment.spec`` (camelCase) in the ConfigMap's YAML."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    model_name: str = Field("tiny", description="Model id served on /v1/models and accepted in requests.")
    model_source: str = Field(
        "builtin:tiny", description="builtin:tiny, or a Hugging Face-layout checkpoint directory."
    )
    chat_template: Literal[("checkpoint", *CHAT_TEMPLATES)] | None = Field(
        None,
        description="The chat template chat prompts are rendered with: checkpoint (the checkpoint's own), or one the"
        " engine ships: smollm2-hermes (SmolLM2's ChatML with tools in the Hermes format, as Qwen2.5's template"
        " renders them; plain chats render as SmolLM2's own template does). Unset: a built-in model's own choice"
        " (builtin:smollm2-135m: smollm2-hermes, so it can call tools), else the checkpoint's.",
    )
    max_seq_len: int = Field(512, ge=limits.MAX_SEQ_LEN_MIN, le=limits.MAX_SEQ_LEN_MAX)
    backend: Literal[limits.BACKENDS] = "cpu"  # rngd: prefill workers on FuriosaAI RNGD (limits.BACKEND_ROLES)
    lanes: int = Field(4, ge=limits.LANES_MIN, le=limits.LANES_MAX)
    kv_blocks: int = Field(8, ge=limits.KV_BLOCKS_MIN, le=limits.KV_BLOCKS_MAX)
    prefix_cache: bool = True
    local_prefill: bool = True
    prefetch_next: bool = False
    remote_prefill_min_tokens: int = Field(
        limits.REMOTE_PREFILL_MIN_TOKENS_DEFAULT, ge=0, le=limits.REMOTE_PREFILL_MIN_TOKENS_MAX,
        description="With localPrefill and prefillWorkers: a prompt whose uncached suffix has at least this many"
        " tokens is prefilled by a worker, a shorter one here (and every one while the prefill pool is down).",
    )
    prefill_workers: str | None = Field(
        None,
        description="host:port of the prefill workers' KV transport (pdKvPort; a headless Service name resolves to"
        " all of them); several host:port entries may be given separated by commas.",
    )
    prefill_chunk: int = Field(64, ge=1, description="Tokens per local prefill step.")
    speculative_tokens: int = Field(
        5, ge=0, le=limits.SPECULATIVE_TOKENS_MAX,
        description="Greedy requests: the most tokens guessed ahead from the request's own text (prompt lookup) and"
        " checked in the same decode step, so a lane may gain several tokens per step; the output is the one"
        " one-token steps give. A request's drafts grow while the model keeps them and shrink when it does not."
        " 0: off. Backends whose decode graph takes one token per lane (atom) decode without drafts.",
    )
    overlap_scheduling: bool = Field(
        True, description="Where the backend has a device of its own (atom): while the device runs a step, a host"
        " thread applies the last one, makes its outputs (text, stop strings, logprobs) and plans the next"
        " (atom_engine.overlap); the outputs are the same. false: one step after the other (for debugging). The"
        " cpu backend steps serially.",
    )
    max_waiting: int = Field(256, ge=1, description="Bound of the waiting queue; past it requests get 429.")
    dtype: DTypeName = "float32"
    num_devices: int = Field(1, ge=1, le=limits.NPUS_PER_REPLICA_MAX, description="NPUs this engine drives"
                             " (the AtomDeployment's npusPerReplica); ignored by the cpu backend.")
    rngd_pes: Literal[1, 2, 4, 8, 16, 32] | None = Field(
        None, description="rngd backend: the PEs (processing elements) fused into its one device. Unset: every PE"
        " of its numDevices RNGD cards (8 per card); a partition of one card has fewer (furiosa.ai/rngd-1core.6gb:"
        " 1, -2core.12gb: 2, -4core.24gb: 4). Compiled graphs are bound to it.")
    cpu_threads: int | None = Field(
        None, ge=limits.CPU_THREADS_MIN, le=limits.CPU_THREADS_MAX,
        description="torch's intra-op threads. Unset: the CPUs the container may use (its cgroup's CFS quota, the"
        " pod's CPU limit and request, the affinity mask), never the host's core count.",
    )
    compile_cache_dir: str | None = Field(None, description="Directory (usually a mounted volume) where compiled"
                                          " graphs are saved with a manifest and loaded by later starts; unset:"
                                          " compile at every start.")
    seed: int = 0
    # PD transfer bounds (serving layer): every wait on a prefill worker ends, see atom_engine.pd.client.
    pd_connect_timeout_seconds: float = Field(3.0, gt=0, description="Connecting to a prefill worker.")
    pd_response_timeout_seconds: float = Field(
        60.0, gt=0, description="Until a shipment starts: the worker's queue plus the prefill."
    )
    pd_read_timeout_seconds: float = Field(10.0, gt=0, description="Between two pieces of a shipment.")
    pd_total_timeout_seconds: float = Field(120.0, gt=0, description="One attempt on one worker, all in.")
    pd_attempts: int = Field(2, ge=1, le=8, description="Workers tried per shipment (a retry goes to another).")
    pd_resolve_interval_seconds: float = Field(5.0, gt=0, description="How often prefillWorkers is re-resolved.")
    pd_unavailable_wait_seconds: float = Field(
        30.0, ge=0,
        description="While no prefill worker answers (none resolved, connections refused or closed before an answer,"
        " as during a rollout or a restart), keep retrying with short backoff for up to this long, then 503.",
    )
    drain_seconds: float = Field(
        5.0, ge=0,
        description="On SIGTERM: /ready answers 503 but requests are still served for this long, so endpoints and"
        " proxies stop routing here before the listeners close.",
    )
    finish_seconds: float = Field(
        15.0, ge=0, description="After the drain: how long in-flight requests may still take before they are cut."
    )
    pd_send_timeout_seconds: float = Field(
        30.0, gt=0, description="Prefill side: one write to a decoder; a decoder that stops reading is dropped."
    )
    pd_kv_port: int = Field(
        8001, ge=0, le=65535,
        description="Prefill side: the port of the KV transport (plain TCP) that decode pods fetch KV from; 0 picks"
        " a free port.",
    )
    pd_lease_seconds: float = Field(
        10.0, ge=0.1, le=300.0,
        description="Decode side: a prefill worker drops a request it has heard nothing about for this long while"
        " it is queued or computed (heartbeats renew it), so a decoder that vanished pins nothing there; and a"
        " worker that says nothing for this long before its answer (it acknowledges each heartbeat) has stopped"
        " or hung, and fails the attempt then rather than at the response timeout.",
    )

    @model_validator(mode="after")
    def _engine_rules(self) -> EngineSettings:
        limits.check(self.view(), scope="engine")
        if self.backend == "rngd" and self.prefix_cache:
            # The operator renders prefill pods with prefixCache false; the rngd backend compiles no block copy.
            raise ValueError("backend rngd runs prefill workers, which run without a prefix cache: set prefixCache:"
                             " false")
        return self

    def view(self) -> limits.EngineView:
        return limits.EngineView(
            lanes=self.lanes,
            kv_blocks=self.kv_blocks,
            prefix_cache=self.prefix_cache,
            local_prefill=self.local_prefill,
            prefetch_next=self.prefetch_next,
            prefill_replicas=1 if self.prefill_workers else 0,
        )

    @classmethod
    def load(cls, path: str | Path) -> EngineSettings:
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})

    def dump(self) -> str:
        return yaml.safe_dump(self.model_dump(by_alias=True, exclude_none=True), sort_keys=True)
