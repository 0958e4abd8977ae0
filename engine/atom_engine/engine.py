"""LLMEngine: settings -> tokenizer, model runner, KV blocks and batcher.

A server drives it from one worker thread (``step()`` never runs on an event loop): ``add_request`` and
``cancel`` are thread-safe and may be called from any thread; each ``step()`` returns the tokens it produced
per request (:class:`StepOutput`), which the server streams. Prefill/decode disaggregation plugs in at the
runner (``export_kv``/``import_kv``) and :class:`SourceSlots`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from atom_engine import limits
from atom_engine.batcher import Batcher
from atom_engine.kv_blocks import KVBlocks, SourceSlots
from atom_engine.sequence import RequestRejected, SamplingParams, Sequence, StepOutput
from atom_engine.settings import EngineSettings

if TYPE_CHECKING:
    from atom_engine.pd.remote import RemotePrefill


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
    def __init__(self, settings: EngineSettings, remote: RemotePrefill | None = None) -> None:
        """``remote``: the decode side of PD disaggregation (atom_engine.pd), required when localPrefill is
        false: the batcher then never prefills locally but imports the KV that prefill workers ship."""
        # EngineSettings validates on construction; check again for settings built without validation.
        limits.check(settings.view(), scope="engine")
        if error := limits.role_backend_error("decode", settings.backend):  # an LLMEngine decodes
            raise ValueError(error)
        if not settings.local_prefill and remote is None:
            raise ValueError(
                "localPrefill: false (remote-only prefill) needs a prefill client: serve with --role decode and"
                " prefillWorkers set, or set localPrefill: true"
            )
        from atom_engine.model.loader import load_model
        from atom_engine.runner import ModelRunner

        self.settings = settings
        self.model, self.tokenizer = load_model(
            settings.model_source, max_seq_len=settings.max_seq_len, dtype=settings.dtype, seed=settings.seed
        )
        self.eos_token_id = self.model.cfg.eos_token_id
        self.vocab_size = self.model.cfg.vocab_size
        self.runner = ModelRunner(self.model, settings)
        self.kv = KVBlocks(settings.kv_blocks, prefix_cache=settings.prefix_cache)
        # One staging slot per lane: each lane waits for at most one shipment (B1 prefetch has one lane).
        self.source_slots = SourceSlots(settings.lanes)
        batcher_args = dict(
            lanes=settings.lanes, max_seq_len=settings.max_seq_len, prefill_chunk=self.runner.chunk,
            max_waiting=settings.max_waiting, eos_token_id=self.eos_token_id,
            detokenize=self.tokenizer.decode if self.tokenizer else None,
        )
        if settings.local_prefill:
            self.batcher = Batcher(self.runner, self.kv, **batcher_args)
        else:
            from atom_engine.pd.remote import RemoteBatcher

            self.batcher = RemoteBatcher(self.runner, self.kv, remote=remote, slots=self.source_slots,
                                         prefetch_next=settings.prefetch_next, **batcher_args)
        self._step_lock = threading.Lock()

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
        return self.batcher.has_work()

    def step(self) -> list[StepOutput]:
        with self._step_lock:
            return self.batcher.step()

    def output(self, seq: Sequence) -> RequestOutput:
        text = None
        if seq.detokenizer is not None:
            text = seq.stop_text if seq.stop_text is not None else seq.detokenizer.text
        return RequestOutput(seq.id, seq.prompt, list(seq.output), text, seq.finish_reason, seq.error,
                             seq.cached_tokens)

    def generate(self, prompts: Iterable[str | list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run prompts to completion (for tests and benchmarks), outputs in prompt order."""
        prompts = list(prompts)
        per = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, per, strict=True)]
        while not all(s.finished for s in seqs):
            self.step()
        return [self.output(s) for s in seqs]

    # -- observability ---------------------------------------------------------------------------
    def stats(self) -> dict[str, int | float]:
        counts = self.kv.counts()
        return {
            "kv_blocks": self.kv.kv_blocks,
            "free_blocks": counts["free"],
            "lane_blocks": counts["lanes"],
            "cached_blocks": counts["cached"],
            "prefix_cache_queries": self.kv.queries,
            "prefix_cache_hits": self.kv.hits,
            "prefix_cache_hit_tokens": self.kv.hit_tokens,
            "waiting": len(self.batcher.waiting),
            "running": len(self.batcher.running()),
            "forward_seconds": self.runner.forward_seconds,
            **self.batcher.counters,
        }
