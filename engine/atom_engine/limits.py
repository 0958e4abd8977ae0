"""Engine limits: the bounds and rules of what one engine can run, defined once and enforced by the engine, the
admission webhook and the CRD's CEL rules.

Each rule is data: a guard, a check and a message built from literal text and terms. Every term carries
both a Python function and the CEL expression of the same value, so the Python check and the generated
``x-kubernetes-validations`` say the same thing in the same words. ``tests/`` prove they agree by running
one table of specs through pydantic, the API server with only the CRD, and the API server with the webhook.

Rules read an :class:`EngineView`: the handful of values the rules look at, with the names they have in
``AtomDeployment.spec``. The engine builds one from its settings, the operator's API from the spec. The rules
only a cluster can check (NPU counts, object names) are the operator's (``atom_operator.api.rules``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

LANES_MIN = 1
LANES_MAX = 256
KV_BLOCKS_MIN = 2
KV_BLOCKS_MAX = 4096
MAX_SEQ_LEN_MIN = 64
MAX_SEQ_LEN_MAX = 32768
# Draft tokens a decode step may verify per lane (speculation, atom_engine.speculation); a step feeds at most one
# more token per lane than this.
SPECULATIVE_TOKENS_MAX = 7
# Intra-op threads an engine may be given explicitly (settings.cpuThreads; unset: from the container's allowance,
# atom_engine.cpu_allowance).
CPU_THREADS_MIN = 1
CPU_THREADS_MAX = 256
# CEL prints numbers digit by digit (see cel_int_string), up to this many digits.
CEL_INT_DIGITS = 5
# Selective PD (localPrefill with prefill workers): uncached prompt tokens from which a worker prefills (below it,
# the decode pod does); the engine's default and the spec's field share these bounds.
REMOTE_PREFILL_MIN_TOKENS_DEFAULT = 512
REMOTE_PREFILL_MIN_TOKENS_MAX = MAX_SEQ_LEN_MAX
NPUS_PER_REPLICA_MAX = 64  # the most devices one engine drives (settings.numDevices, the spec's npusPerReplica)
# An ATOM (RBLN-CA) has 16 GiB of DRAM and keeps 288 MiB of it for the system (optimum-rbln 0.12.0,
# optimum/rbln/utils/runtime_utils.py:48-54); its prefill chunk is a positive multiple of 64
# (optimum/rbln/transformers/modeling_attention_utils.py:92-96).
ATOM_DRAM_BYTES = 16 * 2**30
ATOM_SYSTEM_BYTES = 288 * 2**20
ATOM_PREFILL_CHUNK_MULTIPLE = 64

# One block pads the empty lanes of the static decode batch; with a prefix cache one more is the copy
# source while a lane is admitted (see docs/design.md, "Block rule").
SCRATCH_BLOCKS = 1
COPY_SOURCE_BLOCKS = 1

# The backends the engine runs (atom_engine.backends.make_backend builds each), with the roles each runs: rngd
# compiles only the prefill graph. The engine's settings and the spec's backend enums are made from this table, so
# neither admits a backend the engine cannot run.
BACKEND_ROLES: dict[str, tuple[str, ...]] = {
    "atom": ("decode", "prefill"),
    "rngd": ("prefill",),
    "cpu": ("decode", "prefill"),
}
BACKENDS = tuple(BACKEND_ROLES)
DECODE_BACKENDS = tuple(b for b, roles in BACKEND_ROLES.items() if "decode" in roles)
PREFILL_BACKENDS = tuple(b for b, roles in BACKEND_ROLES.items() if "prefill" in roles)
NPU_BACKENDS = ("atom", "rngd")  # those that drive NPUs (cpu runs on the host)


def role_backend_error(role: str, backend: str) -> str | None:
    """Why ``backend`` cannot run ``role`` (None when it can): decode and standalone engines decode, so they take a
    decode backend; rngd prefills only. The same lists make the spec's decode.backend and prefill.backend enums."""
    allowed = PREFILL_BACKENDS if role == "prefill" else DECODE_BACKENDS
    if backend in allowed:
        return None
    return f"backend {backend!r} cannot run the {role} role (it takes {', '.join(allowed)}); rngd runs prefill only"


def min_kv_blocks(lanes: int, prefix_cache: bool) -> int:
    """The fewest KV blocks an engine with ``lanes`` lanes can run on."""
    return lanes + SCRATCH_BLOCKS + (COPY_SOURCE_BLOCKS if prefix_cache else 0)


@dataclass(frozen=True)
class EngineView:
    """The values the rules read, named as in ``AtomDeployment.spec``."""

    lanes: int
    kv_blocks: int
    prefix_cache: bool
    local_prefill: bool
    prefetch_next: bool
    prefill_replicas: int


@dataclass(frozen=True)
class Term:
    """One value a rule mentions: how Python computes it and how CEL does, from the spec object ``self``."""

    py: Callable[[EngineView], object]
    cel: str
    cel_is_string: bool = False
    cel_is_bool: bool = False

    def render(self, view: EngineView) -> str:
        value = self.py(view)
        if isinstance(value, bool):  # CEL's string(true) is "true"
            return "true" if value else "false"
        return str(value)

    def cel_string(self) -> str:
        if self.cel_is_string:
            return self.cel
        if self.cel_is_bool:
            return f"(({self.cel}) ? 'true' : 'false')"
        return cel_int_string(self.cel)


Part = str | Term


@dataclass(frozen=True)
class Rule:
    """A constraint on the spec; ``applies`` guards it (None: always), ``holds`` is the constraint."""

    id: str
    field: str  # path below spec, e.g. "decode.kvBlocks"
    applies: Term | None
    holds: Term
    message: Sequence[Part]
    scope: str = "engine"  # "engine": the engine checks it too; "spec": only admission can see it (the operator's)
    root: bool = False  # the rule reads metadata, so it lives at the schema's root

    def violated(self, view: EngineView) -> bool:
        if self.applies is not None and not self.applies.py(view):
            return False
        return not self.holds.py(view)

    def render(self, view: EngineView) -> str:
        return "".join(p if isinstance(p, str) else p.render(view) for p in self.message)

    def cel(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry for this rule, placed on ``spec`` (or the root)."""
        rule = self.holds.cel if self.applies is None else f"!({self.applies.cel}) || ({self.holds.cel})"
        message = " + ".join(_cel_literal(p) if isinstance(p, str) else p.cel_string() for p in self.message)
        # A root rule names its field too (metadata.name): without a fieldPath the API server reports "<nil>".
        fields = {"reason": "FieldValueInvalid", "fieldPath": "." + self.field}
        return {"rule": rule, "messageExpression": message, **fields}


def _cel_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _t(py: Callable[[EngineView], object], cel: str, *, string: bool = False, boolean: bool = False) -> Term:
    return Term(py, cel, string, boolean)


_CEL_DIGITS = "['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']"


def cel_int_string(expr: str) -> str:
    """CEL for str(int) of ``expr`` (|value| < 10**CEL_INT_DIGITS), built from one-character strings.

    CEL's own string(int) has no size bound in the API server's cost estimator, so every message that
    concatenates one is refused with "estimated messageExpression cost exceeds budget" (kubernetes#124234).
    """
    magnitude = f"(({expr}) < 0 ? -({expr}) : ({expr}))"
    parts = [f"(({expr}) < 0 ? '-' : '')"]
    for k in range(CEL_INT_DIGITS - 1, 0, -1):
        parts.append(f"({magnitude} >= {10**k} ? {_CEL_DIGITS}[{magnitude} / {10**k} % 10] : '')")
    parts.append(f"{_CEL_DIGITS}[{magnitude} % 10]")
    return "(" + " + ".join(parts) + ")"


LANES = _t(lambda v: v.lanes, "self.decode.lanes")
KV_BLOCKS = _t(lambda v: v.kv_blocks, "self.decode.kvBlocks")
PREFILL_REPLICAS = _t(lambda v: v.prefill_replicas, "self.prefill.replicas")
LOCAL_PREFILL = _t(lambda v: v.local_prefill, "self.decode.localPrefill", boolean=True)

RULES: tuple[Rule, ...] = (
    Rule(
        id="kv-blocks-with-prefix-cache",
        field="decode.kvBlocks",
        applies=_t(lambda v: v.prefix_cache, "self.decode.prefixCache"),
        holds=_t(
            lambda v: v.kv_blocks >= min_kv_blocks(v.lanes, True), "self.decode.kvBlocks >= self.decode.lanes + 2"
        ),
        message=[
            "decode.kvBlocks must be >= decode.lanes + 2 = ",
            _t(lambda v: min_kv_blocks(v.lanes, True), "self.decode.lanes + 2"),
            " when decode.prefixCache is true (one block per lane, one scratch block and one prefix-cache copy"
            " source; with lanes + 1 the first prefix hit fails with 'no KV block available'); got ",
            KV_BLOCKS,
        ],
    ),
    Rule(
        id="kv-blocks",
        field="decode.kvBlocks",
        applies=_t(lambda v: not v.prefix_cache, "!self.decode.prefixCache"),
        holds=_t(
            lambda v: v.kv_blocks >= min_kv_blocks(v.lanes, False), "self.decode.kvBlocks >= self.decode.lanes + 1"
        ),
        message=[
            "decode.kvBlocks must be >= decode.lanes + 1 = ",
            _t(lambda v: min_kv_blocks(v.lanes, False), "self.decode.lanes + 1"),
            " (one block per lane and one scratch block); got ",
            KV_BLOCKS,
        ],
    ),
    Rule(
        id="prefetch-needs-one-lane",
        field="prefill.prefetchNext",
        applies=_t(lambda v: v.prefetch_next, "self.prefill.prefetchNext"),
        holds=_t(lambda v: v.lanes == 1, "self.decode.lanes == 1"),
        message=["prefill.prefetchNext needs decode.lanes == 1; got decode.lanes = ", LANES],
    ),
    Rule(
        id="prefetch-needs-prefill-worker",
        field="prefill.prefetchNext",
        applies=_t(lambda v: v.prefetch_next, "self.prefill.prefetchNext"),
        holds=_t(lambda v: v.prefill_replicas >= 1, "self.prefill.replicas >= 1"),
        message=["prefill.prefetchNext needs prefill.replicas >= 1; got prefill.replicas = ", PREFILL_REPLICAS],
    ),
    Rule(
        id="prefetch-needs-remote-prefill",
        field="prefill.prefetchNext",
        applies=_t(lambda v: v.prefetch_next, "self.prefill.prefetchNext"),
        holds=_t(lambda v: not v.local_prefill, "!self.decode.localPrefill"),
        message=["prefill.prefetchNext needs decode.localPrefill == false; got decode.localPrefill = ", LOCAL_PREFILL],
    ),
    Rule(
        id="remote-prefill-needs-worker",
        field="prefill.replicas",
        applies=_t(lambda v: not v.local_prefill, "!self.decode.localPrefill"),
        holds=_t(lambda v: v.prefill_replicas >= 1, "self.prefill.replicas >= 1"),
        message=[
            "prefill.replicas must be >= 1 when decode.localPrefill is false (remote-only prefill needs a"
            " prefill worker); got prefill.replicas = ",
            PREFILL_REPLICAS,
        ],
    ),
)


def violations(view: EngineView, *, scope: str | None = None) -> list[str]:
    """Messages of every rule ``view`` breaks; ``scope="engine"`` keeps the rules an engine can check."""
    return [r.render(view) for r in RULES if (scope is None or r.scope == scope) and r.violated(view)]


def check(view: EngineView, *, scope: str | None = None) -> None:
    """Raise ``ValueError`` with every broken rule's message, one per line."""
    found = violations(view, scope=scope)
    if found:
        raise ValueError("; ".join(found))
