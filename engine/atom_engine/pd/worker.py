"""The prefill worker's compute: a prompt's KV in a local block, exported for shipping. Runs in one thread.

The block is released (cached when the worker has a prefix cache) before anything is sent, so a slow or dead
decoder never pins the worker's KV blocks; only the exported copy waits for the send, bounded by its timeout.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import replace

import torch

from atom_engine.errors import RequestRejected
from atom_engine.kv_blocks import SCRATCH_BLOCK
from atom_engine.model_stack import ModelStack
from atom_engine.pd.wire import Shipment
from atom_engine.sampling import prompt_logprobs as score_prompt
from atom_engine.sequence import TokenLogprob
from atom_engine.settings import EngineSettings
from atom_engine.stats import KVStats, WorkerStats

log = logging.getLogger(__name__)


class PrefillWorker:
    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        # One block at a time (the lock below) plus scratch: the operator gives prefill pods lanes 1, kvBlocks 2.
        stack = ModelStack.load(settings)
        self.model, self.tokenizer, self.runner, self.kv = stack.model, stack.tokenizer, stack.runner, stack.kv
        self.vocab_size = self.model.cfg.vocab_size
        self._lock = threading.Lock()  # one model: one prefill at a time
        self._ids = itertools.count()
        self.counters = WorkerStats()

    def stats(self) -> WorkerStats:
        """The counters, where the blocks are, and torch's threads."""
        kv = KVStats(**self.kv.stats())
        return replace(self.counters, kv_blocks=kv.kv_blocks, free_blocks=kv.free_blocks,
                       cached_blocks=kv.cached_blocks, lane_blocks=kv.lane_blocks, cpu_threads=torch.get_num_threads())

    def warm(self) -> None:
        """Run the prefill graph once on the scratch block (touches no request's block)."""
        self.runner.prefill_logits(SCRATCH_BLOCK, 0, [0])

    def validate(self, tokens: list[int], start: int) -> None:
        if not tokens:
            raise RequestRejected("prompt_token_ids is empty")
        if len(tokens) > self.settings.max_seq_len:
            raise RequestRejected(f"the prompt has {len(tokens)} tokens; maxSeqLen is {self.settings.max_seq_len}")
        if not 0 <= start < len(tokens):
            raise RequestRejected(f"start must be in [0, {len(tokens)}); got {start}")
        if any(not 0 <= t < self.vocab_size for t in tokens):
            raise RequestRejected(f"token ids must be in [0, {self.vocab_size})")

    def compute(self, request_id: str, tokens: list[int], start: int, gone: threading.Event | None = None,
                prompt_logprobs: int | None = None) -> Shipment | None:
        """KV of ``tokens[start:]`` (attending to the whole prompt) and the last token's logits (with
        ``prompt_logprobs``, each shipped token's logprob and top-N too); None when the requester went away
        (``gone`` is checked before each chunk; the block is released uncached)."""
        self.validate(tokens, start)
        if prompt_logprobs is not None and start != 0:
            raise RequestRejected(f"prompt_logprobs score the whole prompt: start must be 0; got {start}")
        with self._lock:
            if gone is not None and gone.is_set():
                self.counters.prefills_abandoned += 1
                return None
            owner = f"prefill-{next(self._ids)}"
            # Prompt logprobs need every token's logits: no prefix-cache lookup (as the decode side).
            alloc = self.kv.allocate(owner, tokens if prompt_logprobs is None else ())
            scored: list[TokenLogprob | None] = [None]
            ok = False
            try:
                computed = 0
                if alloc.source is not None:
                    try:
                        self.runner.copy_block(alloc.source, alloc.block)
                    finally:
                        self.kv.unpin(alloc.source)
                    computed = alloc.cached_len
                logits = None
                chunk = self.runner.chunk
                while computed < len(tokens):
                    if gone is not None and gone.is_set():  # the decoder left mid-prefill: stop, ship nothing
                        self.counters.prefills_abandoned += 1
                        return None
                    piece = tokens[computed : computed + chunk]
                    every = prompt_logprobs is not None
                    logits = self.runner.prefill_logits(alloc.block, computed, piece, every_token=every)
                    if every:  # row i scores the token after piece[i]
                        nxt = tokens[computed + 1 : computed + len(piece) + 1]
                        scored += score_prompt(logits[: len(nxt)], nxt, prompt_logprobs)
                        logits = logits[-1]
                    computed += len(piece)
                    self.counters.prefill_tokens_computed += len(piece)
                k, v = self.runner.export_kv(alloc.block, start, len(tokens))
                assert logits is not None  # the last prompt token is never cached (KVBlocks.lookup)
                ok = True
            finally:
                self.kv.release(owner, tokens if ok else None)
        return Shipment(request_id, start, tokens[start:], k, v, logits.detach().to(torch.float32).clone(),
                        scored if prompt_logprobs is not None else None)
