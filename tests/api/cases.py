"""One table of AtomDeployments, valid and invalid, that every validation path must judge the same way.

``expect`` lists substrings every refusal must contain: the field, and the bound (and value) where there is one.
Each case changes a small valid base object, so a refusal can only come from what the case changes.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from atom_operator.api import rules

SOURCE = {"source": "builtin:tiny"}
# A remote-only, prefetching single-lane deployment: every prefetch rule holds, one change breaks one.
PREFETCH = {
    "model": SOURCE,
    "decode": {"lanes": 1, "kvBlocks": 3, "localPrefill": False},
    "prefill": {"replicas": 1, "prefetchNext": True},
}


@dataclass(frozen=True)
class Case:
    id: str
    spec: dict[str, Any]
    expect: tuple[str, ...] = ()  # empty: valid
    name: str | None = None
    engine: bool = False  # the engine's own constructor refuses it too (an engine-scope rule)

    @property
    def valid(self) -> bool:
        return not self.expect

    @property
    def object_name(self) -> str:
        return self.name or re.sub(r"[^a-z0-9-]", "-", self.id.lower())[: rules.NAME_MAX_LENGTH].strip("-")

    def manifest(
        self, api_version: str = "serving.atom.dev/v1alpha1", namespace: str | None = None, kind: str = "AtomDeployment"
    ) -> dict:
        meta: dict[str, Any] = {"name": self.object_name}
        if namespace:
            meta["namespace"] = namespace
        return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": copy.deepcopy(self.spec)}


def spec(decode: dict | None = None, prefill: dict | None = None, **top: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": dict(SOURCE)}
    if decode is not None:
        out["decode"] = decode
    if prefill is not None:
        out["prefill"] = prefill
    out.update(top)
    return out


def prefetch(decode: dict | None = None, prefill: dict | None = None) -> dict[str, Any]:
    out = copy.deepcopy(PREFETCH)
    out["decode"].update(decode or {})
    out["prefill"].update(prefill or {})
    return out


KV6 = "decode.kvBlocks must be >= decode.lanes + 2 = "
KV5 = "decode.kvBlocks must be >= decode.lanes + 1 = "

INVALID = [
    # Rule 1: prefix cache needs lanes + 2 blocks.
    Case("pc-lanes4-kv5", spec({"lanes": 4, "kvBlocks": 5}), ("decode.kvBlocks", KV6 + "6", "got 5"), engine=True),
    Case("pc-lanes1-kv2", spec({"lanes": 1, "kvBlocks": 2}), ("decode.kvBlocks", KV6 + "3", "got 2"), engine=True),
    Case("pc-lanes8-default-kv", spec({"lanes": 8}), ("decode.kvBlocks", KV6 + "10", "got 8"), engine=True),
    Case("pc-default-lanes-kv5", spec({"kvBlocks": 5}), ("decode.kvBlocks", KV6 + "6", "got 5"), engine=True),
    Case("pc-lanes256-kv257", spec({"lanes": 256, "kvBlocks": 257}), (KV6 + "258", "got 257"), engine=True),
    # Rule 2: without it, lanes + 1.
    Case("nopc-lanes4-kv4", spec({"lanes": 4, "kvBlocks": 4, "prefixCache": False}), (KV5 + "5", "got 4"), engine=True),
    Case("nopc-lanes2-kv2", spec({"lanes": 2, "kvBlocks": 2, "prefixCache": False}), (KV5 + "3", "got 2"), engine=True),
    Case(
        "nopc-lanes256-kv256",
        spec({"lanes": 256, "kvBlocks": 256, "prefixCache": False}),
        (KV5 + "257", "got 256"),
        engine=True,
    ),
    # Rule 3: prefetchNext needs one lane, a prefill worker and no local prefill.
    Case(
        "prefetch-lanes2",
        prefetch({"lanes": 2, "kvBlocks": 4}),
        ("prefill.prefetchNext", "needs decode.lanes == 1", "got decode.lanes = 2"),
        engine=True,
    ),
    Case(
        "prefetch-lanes4",
        prefetch({"lanes": 4, "kvBlocks": 6}),
        ("prefill.prefetchNext", "needs decode.lanes == 1", "got decode.lanes = 4"),
        engine=True,
    ),
    Case(
        "prefetch-no-worker",
        prefetch(prefill={"replicas": 0}),
        ("prefill.prefetchNext needs prefill.replicas >= 1; got prefill.replicas = 0",),
        engine=True,
    ),
    Case(
        "prefetch-local-prefill",
        prefetch({"localPrefill": True}),
        ("prefill.prefetchNext needs decode.localPrefill == false; got decode.localPrefill = true",),
        engine=True,
    ),
    Case(
        "prefetch-everything-wrong",
        prefetch({"lanes": 2, "kvBlocks": 4, "localPrefill": True}, {"replicas": 0}),
        ("got decode.lanes = 2", "got prefill.replicas = 0", "got decode.localPrefill = true"),
        engine=True,
    ),
    # Rule 4: remote-only prefill needs a worker.
    Case(
        "remote-only-no-worker",
        spec({"localPrefill": False}),
        ("prefill.replicas", "must be >= 1 when decode.localPrefill is false", "got prefill.replicas = 0"),
        engine=True,
    ),
    # Rule 5: NPU backends need NPUs, cpu takes none.
    Case(
        "decode-atom-0-npus",
        spec({"npusPerReplica": 0}),
        ("decode.npusPerReplica must be >= 1 for the NPU backend 'atom'; got 0",),
    ),
    Case("decode-cpu-default-npus", spec({"backend": "cpu"}), ("decode.npusPerReplica must be 0", "got 1")),
    Case("decode-cpu-2-npus", spec({"backend": "cpu", "npusPerReplica": 2}), ("decode.npusPerReplica", "got 2")),
    Case("prefill-atom-0-npus", spec(prefill={"npusPerReplica": 0}), ("prefill.npusPerReplica", "'atom'; got 0")),
    Case(
        "prefill-rngd-0-npus",
        spec(prefill={"backend": "rngd", "npusPerReplica": 0, "replicas": 1}),
        ("prefill.npusPerReplica must be >= 1 for the NPU backend 'rngd'; got 0",),
    ),
    Case("prefill-cpu-default-npus", spec(prefill={"backend": "cpu"}), ("prefill.npusPerReplica must be 0", "got 1")),
    # Rule 6: bounds.
    Case("lanes-0", spec({"lanes": 0}), ("decode.lanes", "greater than or equal to 1")),
    Case("lanes-257", spec({"lanes": 257, "kvBlocks": 300}), ("decode.lanes", "less than or equal to 256")),
    Case("kv-blocks-1", spec({"lanes": 1, "kvBlocks": 1, "prefixCache": False}), ("decode.kvBlocks", "equal to 2")),
    Case("kv-blocks-4097", spec({"kvBlocks": 4097}), ("decode.kvBlocks", "less than or equal to 4096")),
    Case("max-seq-len-63", spec(model={**SOURCE, "maxSeqLen": 63}), ("model.maxSeqLen", "greater than or equal to 64")),
    Case("max-seq-len-32769", spec(model={**SOURCE, "maxSeqLen": 32769}), ("model.maxSeqLen", "equal to 32768")),
    Case("decode-replicas-negative", spec({"replicas": -1}), ("decode.replicas", "greater than or equal to 0")),
    Case(
        "prefill-replicas-negative", spec(prefill={"replicas": -1}), ("prefill.replicas", "greater than or equal to 0")
    ),
    Case("npus-65", spec({"npusPerReplica": 65}), ("decode.npusPerReplica", "less than or equal to 64")),
    Case("port-0", spec(service={"port": 0}), ("service.port", "greater than or equal to 1")),
    Case("port-65536", spec(service={"port": 65536}), ("service.port", "less than or equal to 65535")),
    Case(
        "name-49",
        spec(),
        ("metadata.name: ", "metadata.name must be at most 48 characters", "got 49"),
        name="n" * (rules.NAME_MAX_LENGTH + 1),
    ),
    Case("name-63", spec(), ("metadata.name: ", "metadata.name must be at most 48", "got 63"), name="m" * 63),
    # Wrong types: no coercion, on any path.
    Case("lanes-string", spec({"lanes": "4"}), ("decode.lanes", "integer")),
    Case("lanes-float", spec({"lanes": 2.5}), ("decode.lanes", "integer")),
    Case("max-seq-len-bool", spec(model={**SOURCE, "maxSeqLen": True}), ("model.maxSeqLen", "integer")),
    Case("prefix-cache-string", spec({"prefixCache": "yes"}), ("decode.prefixCache", "boolean")),
    Case("decode-not-object", spec("big"), ("spec.decode",)),
    Case("tolerations-not-list", spec({"tolerations": {"key": "x"}}), ("decode.tolerations",)),
    # Enums.
    Case("decode-backend-tpu", spec({"backend": "tpu"}), ("decode.backend", "atom", "cpu")),
    Case("prefill-backend-gpu", spec(prefill={"backend": "gpu"}), ("prefill.backend", "rngd")),
    Case("service-type-external", spec(service={"type": "ExternalName"}), ("service.type", "ClusterIP")),
    Case("pull-policy-sometimes", spec(imagePullPolicy="Sometimes"), ("imagePullPolicy", "IfNotPresent")),
    Case("toleration-operator", spec({"tolerations": [{"operator": "Maybe"}]}), ("tolerations[0].operator", "Exists")),
    # Unknown fields.
    Case("unknown-decode-field", spec({"batchSize": 4}), ("decode.batchSize",)),
    Case("unknown-spec-field", spec(replicas=3), ("spec.replicas",)),
    Case("unknown-model-field", spec(model={**SOURCE, "revision": "main"}), ("model.revision",)),
    # Required fields and formats.
    Case("model-missing", {"decode": {}}, ("spec.model", "equired")),
    Case("source-missing", spec(model={"maxSeqLen": 512}), ("model.source", "equired")),
    Case("source-url", spec(model={"source": "hf://meta/llama"}), ("model.source", "builtin:")),
    # Only the engine's registered built-in models (atom_engine.model.builtin) pass; the refusal lists them.
    Case("source-builtin-unknown", spec(model={"source": "builtin:llama"}), ("model.source", "builtin:smollm2-135m")),
    Case("source-builtin-suffix", spec(model={"source": "builtin:tiny2"}), ("model.source", "builtin:tiny")),
    Case("source-huge", spec(model={"source": "/" + "a" * 5000}), ("model.source", "4096")),
    Case("quantity-garbage", spec({"resources": {"limits": {"memory": "lots"}}}), ("decode.resources.limits.memory",)),
    # Huge collections.
    Case("tolerations-33", spec({"tolerations": [{"key": f"k{i}"} for i in range(33)]}), ("decode.tolerations", "32")),
    Case(
        "node-selector-33",
        spec({"nodeSelector": {f"k{i}": "v" for i in range(33)}}),
        ("decode.nodeSelector", "32"),
    ),
]


def scaled(spec_decode: dict | None = None, spec_prefill: dict | None = None, **auto: Any) -> dict:
    """A spec with spec.autoscaling (mode Operator, decode 1..4) and the case's spec.decode, spec.prefill and
    spec.autoscaling fields."""
    autoscaling: dict[str, Any] = {"mode": "Operator", "decode": {"minReplicas": 1, "maxReplicas": 4}, **auto}
    return spec(spec_decode, spec_prefill, autoscaling=autoscaling)


PREFILL_1_4 = {"minReplicas": 1, "maxReplicas": 4}
BAND_2_5_TO_1_2 = {"min": {"prefill": 2, "decode": 5}, "max": {"prefill": 1, "decode": 2}}

AUTOSCALING_INVALID = [
    Case(
        "as-decode-min-above-max",
        scaled(decode={"minReplicas": 5, "maxReplicas": 4}),
        ("autoscaling.decode.minReplicas must be <= autoscaling.decode.maxReplicas = 4; got 5",),
    ),
    Case(
        "as-decode-min-0",
        scaled(decode={"minReplicas": 0, "maxReplicas": 4}),
        ("autoscaling.decode.minReplicas", "greater than or equal to 1"),
    ),
    Case("as-decode-max-missing", scaled(decode={"minReplicas": 1}), ("autoscaling.decode.maxReplicas",)),
    Case("as-mode-auto", scaled(mode="Auto"), ("autoscaling.mode", "Operator")),
    Case(
        "as-prefill-min-above-max",
        scaled(prefill={"minReplicas": 3, "maxReplicas": 2}),
        ("autoscaling.prefill.minReplicas must be <= autoscaling.prefill.maxReplicas = 2; got 3",),
    ),
    Case(
        "as-prefill-min-0-remote-only",
        scaled({"localPrefill": False}, {"replicas": 1}, prefill={"minReplicas": 0, "maxReplicas": 2}),
        ("autoscaling.prefill.minReplicas must be >= 1 while decode.localPrefill is false", "got 0"),
    ),
    Case(
        "as-ratio-without-prefill",
        scaled(ratio=BAND_2_5_TO_1_2),
        ("autoscaling.ratio needs autoscaling.prefill",),
    ),
    Case(
        "as-ratio-reversed",
        scaled(prefill=PREFILL_1_4, ratio={"min": {"prefill": 2, "decode": 1}, "max": {"prefill": 1, "decode": 1}}),
        ("autoscaling.ratio.min must not exceed autoscaling.ratio.max", "got 2:1 to 1:1"),
    ),
    Case(
        # 0.4..0.5 prefill per decode pod: no prefill count exists for one decode pod, two are needed.
        "as-ratio-unreachable",
        scaled(decode={"minReplicas": 1, "maxReplicas": 1}, prefill=PREFILL_1_4, ratio=BAND_2_5_TO_1_2),
        ("autoscaling.ratio cannot be met inside the replica bounds", "from 1 to 1", "from 1 to 4", "2:5 to 1:2"),
    ),
    Case(
        # Real ratios exist (1.33..1.5 prefill for 3 decode pods), no integer one.
        "as-ratio-unreachable-integers",
        scaled(
            decode={"minReplicas": 3, "maxReplicas": 3},
            prefill=PREFILL_1_4,
            ratio={"min": {"prefill": 4, "decode": 9}, "max": {"prefill": 1, "decode": 2}},
        ),
        ("autoscaling.ratio cannot be met", "from 3 to 3"),
    ),
    Case(
        "as-ratio-term-17",
        scaled(prefill=PREFILL_1_4, ratio={"min": {"prefill": 1, "decode": 17}, "max": {"prefill": 1, "decode": 1}}),
        ("autoscaling.ratio.min.decode", "less than or equal to 16"),
    ),
    Case(
        "as-ratio-term-0",
        scaled(prefill=PREFILL_1_4, ratio={"min": {"prefill": 0, "decode": 1}, "max": {"prefill": 1, "decode": 1}}),
        ("autoscaling.ratio.min.prefill", "greater than or equal to 1"),
    ),
    Case(
        # decode 2 needs one prefill worker (1:2 at least): 2 + 1 NPUs.
        "as-budget-below-smallest-pair",
        scaled(
            decode={"minReplicas": 2, "maxReplicas": 4},
            prefill=PREFILL_1_4,
            ratio={"min": {"prefill": 1, "decode": 2}, "max": {"prefill": 1, "decode": 1}},
            npuBudget=2,
        ),
        ("autoscaling.npuBudget must be >= 3", "got 2"),
    ),
    Case(
        # The band's smallest pair is 1 prefill : 2 decode (2:5 has none for decode 1); 4 NPUs per decode pod.
        "as-budget-band-smallest-pair",
        scaled(
            {"npusPerReplica": 4},
            decode={"minReplicas": 1, "maxReplicas": 4},
            prefill=PREFILL_1_4,
            ratio=BAND_2_5_TO_1_2,
            npuBudget=8,
        ),
        ("autoscaling.npuBudget must be >= 9", "got 8"),
    ),
    Case(
        # Without autoscaling.prefill the fixed prefill workers count against the budget.
        "as-budget-fixed-prefill",
        scaled(None, {"replicas": 3}, npuBudget=3),
        ("autoscaling.npuBudget must be >= 4", "got 3"),
    ),
    Case(
        "as-slo-and-utilization",
        scaled(prefill={**PREFILL_1_4, "targetUtilizationPercent": 60}, slo={"ttftMilliseconds": 2000}),
        ("autoscaling.prefill.targetUtilizationPercent must be unset when autoscaling.slo is set", "got 60"),
    ),
    Case("as-slo-without-prefill", scaled(slo={"ttftMilliseconds": 2000}), ("autoscaling.slo needs autoscaling",)),
    Case(
        "as-occupancy-101",
        scaled(decode={"maxReplicas": 2, "targetOccupancyPercent": 101}),
        ("autoscaling.decode.targetOccupancyPercent", "less than or equal to 100"),
    ),  # fmt: skip
    Case(
        "as-window-3601",
        scaled(behavior={"scaleDown": {"stabilizationWindowSeconds": 3601}}),
        ("autoscaling.behavior.scaleDown.stabilizationWindowSeconds", "3600"),
    ),  # fmt: skip
    Case("as-drain-0", scaled(drain={"timeoutSeconds": 0}), ("autoscaling.drain.timeoutSeconds", "equal to 1")),
    Case("as-unknown-field", scaled(targetQueue=3), ("autoscaling.targetQueue",)),
]

AUTOSCALING_VALID = [
    Case("as-decode-only", scaled()),
    Case("as-off-with-bounds", scaled(mode="Off")),
    Case("as-external", scaled(mode="External")),
    Case(
        "as-pd-band-budget",
        scaled(
            {"localPrefill": False},
            {"replicas": 1},
            prefill=PREFILL_1_4,
            ratio={"min": {"prefill": 1, "decode": 2}, "max": {"prefill": 2, "decode": 1}},
            npuBudget=4,
        ),
    ),
    # 2:5..1:2 is unreachable with one decode pod but reachable with two (1:2): the search must find it.
    Case("as-band-needs-two-decode", scaled(prefill=PREFILL_1_4, ratio=BAND_2_5_TO_1_2, npuBudget=3)),
    Case(
        "as-slo",
        scaled(prefill={**PREFILL_1_4, "tokensPerSecondHint": 2000}, slo={"ttftMilliseconds": 2000}),
    ),
    Case("as-prefill-min-0-local", scaled(prefill={"minReplicas": 0, "maxReplicas": 2})),
    Case("as-cpu-budget-0", scaled({"backend": "cpu", "npusPerReplica": 0}, npuBudget=0)),
    Case(
        "as-behavior",
        scaled(
            behavior={
                "tolerancePercent": 0,
                "scaleUp": {"stabilizationWindowSeconds": 30, "maxPodsPerInterval": 4},
                "scaleDown": {"stabilizationWindowSeconds": 0, "maxPodsPerInterval": 2},
            },
            drain={"timeoutSeconds": 30},
            intervalSeconds=5,
        ),
    ),
]

VALID = [
    Case("minimal", spec()),
    Case("builtin-smollm2", spec(model={"source": "builtin:smollm2-135m"})),
    Case("pc-lanes4-kv6", spec({"lanes": 4, "kvBlocks": 6})),
    Case("nopc-lanes1-kv2", spec({"lanes": 1, "kvBlocks": 2, "prefixCache": False})),
    Case("pc-lanes1-kv3", spec({"lanes": 1, "kvBlocks": 3})),
    Case("nopc-lanes4-kv5", spec({"lanes": 4, "kvBlocks": 5, "prefixCache": False})),
    Case("prefetch", prefetch()),
    Case("prefetch-nopc-kv2", prefetch({"kvBlocks": 2, "prefixCache": False})),
    Case("cpu-both-roles", spec({"backend": "cpu", "npusPerReplica": 0}, {"backend": "cpu", "npusPerReplica": 0})),
    Case("pd-rngd", spec({"localPrefill": False, "replicas": 2}, {"replicas": 2, "backend": "rngd"})),
    Case(
        "upper-bounds",
        spec(
            {"lanes": 256, "kvBlocks": 4096, "npusPerReplica": 64},
            model={**SOURCE, "maxSeqLen": 32768},
            service={"port": 65535},
        ),
    ),
    Case(
        "lower-bounds",
        spec({"replicas": 0, "lanes": 1, "kvBlocks": 2, "prefixCache": False}, model={**SOURCE, "maxSeqLen": 64}),
    ),
    Case("name-48", spec(), name="v" * rules.NAME_MAX_LENGTH),
    Case("empty-prefill", spec(prefill={})),
    Case("node-port-service", spec(service={"type": "NodePort", "port": 80}, imagePullPolicy="IfNotPresent")),
    Case(
        "placement",
        spec(
            {
                "resources": {"limits": {"memory": "16Gi", "cpu": 4}, "requests": {"cpu": "500m"}},
                "nodeSelector": {"pool": "npu"},
                "tolerations": [{"key": "npu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
            },
            model={"source": "/models/llama", "volume": {"persistentVolumeClaim": {"claimName": "llama"}}},
            image="registry.example/atom-engine:0.1.0",
        ),
    ),
]

INVALID += AUTOSCALING_INVALID
VALID += AUTOSCALING_VALID
ALL = INVALID + VALID
