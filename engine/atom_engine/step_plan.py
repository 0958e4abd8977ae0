"""One engine step as data: what the batcher decided (:class:`StepPlan`), and what running it gave
(:class:`StepResult`), item by item. Pure Python.

The batcher plans (``Batcher.schedule``), the runner side runs the plan (:func:`atom_engine.plan_executor.execute`)
and the batcher folds the result back in (``Batcher.apply``), as vLLM v1's ``SchedulerOutput`` /
``ModelRunnerOutput`` / ``update_from_output``. The plan names sequences; the runner reads their inputs (the
last token, the block, the position) when it runs the plan, and writes nothing the batcher owns but the sampler's
state and logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from atom_engine.kv_connector import LoadedKV
from atom_engine.sequence import Sequence


@dataclass(frozen=True)
class Admission:
    """A request given a lane this step; ``source``: the prefix-cache block copied into its own (``block``)
    first, whose ``cached`` tokens it need not prefill."""

    seq: Sequence
    block: int
    source: int | None = None
    cached: int = 0


@dataclass(frozen=True)
class Chunk:
    """A prefill chunk: the prompt's ``tokens`` at positions ``start..`` into the lane's block; ``last``: it ends
    the prompt (the first output token is sampled)."""

    seq: Sequence
    start: int
    tokens: list[int]
    last: bool


@dataclass(frozen=True)
class Import:
    """KV computed elsewhere (a KV connector's shipment) into the lane's block; the first token from its logits."""

    seq: Sequence
    loaded: LoadedKV


@dataclass(frozen=True)
class DecodeBatch:
    """The decode step over all lanes (None: an empty lane) with each lane's draft (empty: none).

    ``indices`` (the lanes that compute) and ``plain`` (no lane has a draft) are worked out when the batch is
    planned, which an overlapped step does beside the forward before, so that running the batch (between two
    forwards) does not walk the lanes for them."""

    lanes: tuple[Sequence | None, ...]
    drafts: tuple[tuple[int, ...], ...]
    indices: tuple[int, ...] = field(init=False)
    plain: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(i for i, s in enumerate(self.lanes) if s is not None))
        object.__setattr__(self, "plain", not any(self.drafts))


@dataclass(frozen=True)
class StepPlan:
    """Everything one step runs, in this order: the admissions' block copies, the prefill chunks on their own
    forwards, the imports, then the decode batch, with ``riders`` (prefill chunks in the decode forward, where
    the backend mixes them) in the same forward."""

    admissions: tuple[Admission, ...] = ()
    chunks: tuple[Chunk, ...] = ()
    imports: tuple[Import, ...] = ()
    riders: tuple[Chunk, ...] = ()
    decode: DecodeBatch | None = None

    @property
    def runs_forward(self) -> bool:
        """Whether the step computes anything (False: every lane waits, e.g. for a shipment)."""
        decodes = self.decode is not None and bool(self.decode.indices)
        return bool(self.admissions or self.chunks or self.imports or self.riders or decodes)


@dataclass
class StepResult:
    """Per plan item, aligned with the plan's tuples: the item's outcome, or the exception it failed with.

    ``copies``: None (done) or the failure; ``chunks`` / ``riders``: the first output token of a ``last`` chunk,
    None for another, or the failure; ``imports``: the first output token or the failure; ``decode``: per lane,
    its new tokens (the draft tokens the model agreed with, then its own), None for an empty lane, or the
    failure; ``drafts``: the drafts the decode step actually checked (a lane retried alone has none)."""

    copies: list[Exception | None] = field(default_factory=list)
    chunks: list[int | None | Exception] = field(default_factory=list)
    imports: list[int | Exception] = field(default_factory=list)
    riders: list[int | None | Exception] = field(default_factory=list)
    decode: list[list[int] | None | Exception] = field(default_factory=list)
    drafts: list[tuple[int, ...]] = field(default_factory=list)
