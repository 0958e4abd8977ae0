"""LLMEngine: settings -> tokenizer, model runner, KV blocks (a :class:`ModelStack`) and the batcher.

A server drives it from one worker thread (``step()`` never runs on an event loop): ``add_request`` and
``cancel`` are thread-safe and may be called from any thread; each ``step()`` returns the tokens and text it
produced per request (:class:`StepOutput`), which the server streams. Prefill/decode disaggregation plugs in as
the batcher's KV connector (:mod:`atom_engine.kv_connector`), the KV moving through the runner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

from atom_engine import limits
from atom_engine.batcher import Batcher
from atom_engine.capabilities import Capabilities
from atom_engine.errors import RequestRejected
from atom_engine.kv_blocks import SCRATCH_BLOCK
from atom_engine.kv_connector import KVConnector
from atom_engine.model_stack import ModelStack
from atom_engine.overlap import OverlappedSteps
from atom_engine.sequence import SamplingParams, Sequence, StepOutput
from atom_engine.settings import EngineSettings
from atom_engine.stats import EngineStats, KVStats

if TYPE_CHECKING:
    from atom_engine.pd.connectors import PrefillPool


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    error: str | None
    cached_tokens: int


class LLMEngine:
    def __init__(self, settings: EngineSettings, connector: KVConnector | None = None, *,
                 prefill_pool: PrefillPool | None = None) -> None:
        """``prefill_pool``: PD's decode side, how to reach the prefill workers; the engine builds the KV connector
        its settings ask for with it (:mod:`atom_engine.pd.connectors`: remote-only, where the batcher never
        prefills locally but imports the KV that workers ship, or selective). ``connector``: a connector built
        elsewhere instead (tests, other transports). One of them is required when localPrefill is false."""
        if connector is None and prefill_pool is not None:
            from atom_engine.pd.connectors import build_connector

            connector = build_connector(settings, prefill_pool)
        # EngineSettings validates on construction; check again for settings built without validation.
        limits.check(settings.view(), scope="engine")
        if error := limits.role_backend_error("decode", settings.backend):  # an LLMEngine decodes
            raise ValueError(error)
        if not settings.local_prefill and connector is None:
            raise ValueError(
                "localPrefill: false (remote-only prefill) needs a prefill client: serve with --role decode and"
                " prefillWorkers set, or set localPrefill: true"
            )
        self.settings = settings
        stack = ModelStack.load(settings)
        self.model, self.tokenizer, self.runner, self.kv = stack.model, stack.tokenizer, stack.runner, stack.kv
        self.eos_token_id = self.model.cfg.eos_token_id
        self.vocab_size = self.model.cfg.vocab_size
        self.connector = connector
        if connector is not None:
            connector.bind(self.kv, self.model)
        self.batcher = Batcher(
            self.runner, self.kv, lanes=settings.lanes, max_seq_len=settings.max_seq_len,
            prefill_chunk=self.runner.chunk, max_waiting=settings.max_waiting, eos_token_id=self.eos_token_id,
            detokenize=self.tokenizer.decode if self.tokenizer else None, connector=connector,
            speculative_tokens=self.runner.speculative_tokens,
        )
        # Overlapped: while the device runs a step, a host thread applies the last one, makes its outputs and
        # plans the next plain decode step (atom_engine.overlap); only where the backend has a device of its own
        # (on the cpu backend both would share the same cores), and only without drafts: a stop string inside an
        # accepted draft cuts the request's output, which the running step's forward may be reading. Off, plan,
        # run, apply and outputs follow each other (Batcher.step).
        overlap = (settings.overlap_scheduling and self.runner.capabilities.devices > 0
                   and self.batcher.speculative_tokens == 0)
        self._overlap = OverlappedSteps(self.batcher, self.runner) if overlap else None
        self._step_lock = threading.Lock()

    def warm(self) -> None:
        """Run the graphs once before serving, so the first request does not pay for it. Decode writes into a
        free block (its contents mean nothing until a prefill or import overwrites them), prefill into scratch."""
        block = self.kv.allocate("warm-up").block
        try:
            probe = Sequence("warm-up", [0], SamplingParams(max_tokens=1), block=block)
            self.runner.decode([probe] + [None] * (self.settings.lanes - 1))
        finally:
            self.kv.release("warm-up")
        if self.settings.local_prefill:
            self.runner.prefill_logits(SCRATCH_BLOCK, 0, [0])

    # -- requests --------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestRejected(f"model {self.settings.model_source} has no tokenizer.json; send token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestRejected(f"token ids must be in [0, {self.vocab_size}); got {bad[:5]}")
        return ids

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> Sequence:
        """Queue a request; raises RequestRejected (400) or QueueFull (429). Thread-safe."""
        return self.batcher.add(self.encode(prompt), params or SamplingParams(), request_id)

    def cancel(self, request_id: str) -> None:
        """End a request at the next step (finish_reason "cancelled"). Thread-safe."""
        self.batcher.cancel(request_id)

    def has_unfinished(self) -> bool:
        return self.batcher.has_work() or (self._overlap is not None and self._overlap.holding)

    def step(self) -> list[StepOutput]:
        with self._step_lock:
            return self.batcher.step() if self._overlap is None else self._overlap.step()

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        """How the KV connector (if any) wakes the serving layer's loop when a shipment arrives."""
        if self.connector is not None:
            self.connector.set_wakeup(wakeup)

    def close(self) -> None:
        """Stop the overlapped steps' host thread (after the last step; the engine steps no more)."""
        if self._overlap is not None:
            self._overlap.close()

    @property
    def capabilities(self) -> Capabilities:
        """What this engine's backend can do (prompt logprobs, drafts, mixed steps, KV transfer, devices)."""
        return self.runner.capabilities

    @property
    def speculative_tokens(self) -> int:
        """The longest draft a decode step verifies per lane (0 where the backend decodes without drafts)."""
        return self.batcher.speculative_tokens

    @property
    def stalled(self) -> bool:
        """The last step had nothing to compute: every lane waits (for a shipment, a staging slot)."""
        return not self.batcher.last_plan.runs_forward and not (self._overlap is not None and self._overlap.holding)

    def output(self, seq: Sequence) -> RequestOutput:
        """A finished request's result (for in-process callers: tests, benchmarks, :meth:`generate`)."""
        return RequestOutput(seq.id, seq.prompt, list(seq.output), seq.text, seq.finish_reason, seq.error,
                             seq.cached_tokens)

    def generate(self, prompts: Iterable[str | list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run prompts to completion (for tests and benchmarks), outputs in prompt order."""
        prompts = list(prompts)
        per = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, per, strict=True)]
        while not all(s.output_done for s in seqs):  # overlapped, the last outputs come a step after the end
            self.step()
        return [self.output(s) for s in seqs]

    # -- observability ---------------------------------------------------------------------------
    def figures(self) -> list[object]:
        """Each component's own stats object: the KV blocks', the batcher's, the engine's (runner and threads)
        and the connector's (what /metrics reads by attribute, :mod:`atom_engine.stats`)."""
        out: list[object] = [
            KVStats(**self.kv.stats()),  # a key the KV blocks rename is a TypeError here, at the first scrape
            self.batcher.stats(),
            self.batcher.requests.stats(),
            EngineStats(forward_seconds=self.runner.forward_seconds, cpu_threads=torch.get_num_threads()),
        ]
        if self.connector is not None:
            out.append(self.connector.stats())
        return out

    def stats(self) -> dict[str, float]:
        """:meth:`figures` as one mapping by field name (for in-process callers: tests, benchmarks)."""
        return {name: value for figure in self.figures() for name, value in asdict(figure).items()}
