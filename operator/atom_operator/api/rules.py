"""The spec's rules: the engine's own (:mod:`atom_engine.limits`) and those only a cluster can check.

An engine cannot see how many NPUs its pod requests or what the object is called; admission can. These rules are
written like the engine's (a guard, a check and a message, each term in Python and in CEL), so the webhook and the
CRD's ``x-kubernetes-validations`` say the same thing, and they read a :class:`SpecView`: the engine's view plus
the fields they need.
"""

from __future__ import annotations

from dataclasses import dataclass

from atom_engine import limits
from atom_engine.limits import Rule, Term

from atom_operator.api import autoscaling_rules
from atom_operator.api.autoscaling import AutoscalingSpec

REPLICAS_MIN = 0
REPLICAS_MAX = 10**limits.CEL_INT_DIGITS - 1  # CEL prints a message's numbers up to this many digits
PORT_MIN = 1
PORT_MAX = 65535

# Children are named <name><suffix>; every one must stay a DNS-1035 label (63 characters).
CHILD_NAME_SUFFIXES = (
    "",
    "-decode",
    "-prefill",
    "-decode-config",
    "-prefill-config",
    "-decode-build",  # the compile Jobs (spec.model.compileCache)
    "-prefill-build",
    "-epp",  # spec.routing.inferencePool's endpoint picker (Deployment, Service, ServiceAccount, Role, RoleBinding)
)
DNS_LABEL_MAX = 63
NAME_MAX_LENGTH = DNS_LABEL_MAX - max(len(s) for s in CHILD_NAME_SUFFIXES)


@dataclass(frozen=True)
class SpecView(limits.EngineView):
    """The engine's view of a spec, and what only the cluster sees: each role's backend and NPUs, the name."""

    decode_backend: str | None = None
    decode_npus: int | None = None
    prefill_backend: str | None = None
    prefill_npus: int | None = None
    name: str | None = None
    autoscaling: AutoscalingSpec | None = None


_NPU_BACKENDS_CEL = "[" + ", ".join(f"'{b}'" for b in limits.NPU_BACKENDS) + "]"


def _npu_rules(role: str) -> list[Rule]:
    backend = lambda v: getattr(v, f"{role}_backend")  # noqa: E731
    npus = lambda v: getattr(v, f"{role}_npus")  # noqa: E731
    backend_t = Term(backend, f"self.{role}.backend", cel_is_string=True)
    npus_t = Term(npus, f"self.{role}.npusPerReplica")
    return [
        Rule(
            id=f"{role}-npu-backend-needs-npus",
            field=f"{role}.npusPerReplica",
            applies=Term(lambda v: backend(v) in limits.NPU_BACKENDS, f"self.{role}.backend in {_NPU_BACKENDS_CEL}"),
            holds=Term(lambda v: npus(v) >= 1, f"self.{role}.npusPerReplica >= 1"),
            message=[f"{role}.npusPerReplica must be >= 1 for the NPU backend '", backend_t, "'; got ", npus_t],
            scope="spec",
        ),
        Rule(
            id=f"{role}-cpu-backend-takes-no-npus",
            field=f"{role}.npusPerReplica",
            applies=Term(lambda v: backend(v) == "cpu", f"self.{role}.backend == 'cpu'"),
            holds=Term(lambda v: npus(v) == 0, f"self.{role}.npusPerReplica == 0"),
            message=[f"{role}.npusPerReplica must be 0 for the cpu backend; got ", npus_t],
            scope="spec",
        ),
    ]


RULES: tuple[Rule, ...] = (
    *limits.RULES,
    *_npu_rules("decode"),
    *_npu_rules("prefill"),
    *autoscaling_rules.RULES,
    Rule(
        id="name-length",
        field="metadata.name",
        applies=None,
        holds=Term(
            lambda v: v.name is None or len(v.name) <= NAME_MAX_LENGTH, f"size(self.metadata.name) <= {NAME_MAX_LENGTH}"
        ),
        message=[
            f"metadata.name must be at most {NAME_MAX_LENGTH} characters so that every child name"
            f" (<name>{max(CHILD_NAME_SUFFIXES, key=len)}) stays a {DNS_LABEL_MAX}-character DNS label; got ",
            Term(lambda v: len(v.name or ""), "size(self.metadata.name)"),
        ],
        scope="spec",
        root=True,
    ),
)


def cel_rules(*, root: bool = False) -> list[dict[str, str]]:
    """``x-kubernetes-validations`` for ``spec`` (``root=False``) or the object's root."""
    return [r.cel() for r in RULES if r.root == root]
