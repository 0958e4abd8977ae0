"""The model runner: turns the batcher's sequences into static-shape graph inputs (decode ``[lanes, 1]``, prefill
``[1, chunk]``) for its backend, which owns the KV cache: KV moves in and out of it (PD) through the backend only."""

from __future__ import annotations

import concurrent.futures
import time

import torch

from atom_engine.artifacts import build_backend
from atom_engine.capabilities import Capabilities
from atom_engine.kv_blocks import SCRATCH_BLOCK
from atom_engine.kv_connector import LoadedKV
from atom_engine.model.llama import LlamaForCausalLM
from atom_engine.sampling import prepare_masks, prompt_logprobs, sample, sample_batch, verify_draft
from atom_engine.sequence import Sequence
from atom_engine.settings import EngineSettings


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, settings: EngineSettings) -> None:
        self.model = model
        self.lanes = settings.lanes
        self.kv_blocks = settings.kv_blocks
        self.chunk = min(settings.prefill_chunk, model.max_seq_len)
        self.backend = build_backend(settings, model, self.chunk)  # loads or compiles (and saves) the graphs
        self.forward_seconds = 0.0  # time inside graphs, for the engine-overhead figure
        self.capabilities: Capabilities = self.backend.capabilities
        # Draft tokens a decode step may verify per lane; 0 where the backend's decode graph takes one token per
        # lane (the NPU backends compile [lanes, 1]).
        self.speculative_tokens = settings.speculative_tokens if self.capabilities.verify else 0
        self._grammar_thread: concurrent.futures.ThreadPoolExecutor | None = None  # see _prepare_masks

    @torch.inference_mode()
    def prefill(self, seq: Sequence, start: int, tokens: list[int], last: bool) -> int | None:
        top = seq.params.prompt_logprobs
        logits = self.prefill_logits(seq.block, start, tokens, every_token=top is not None)
        if top is not None:  # row i scores the prompt token after chunk token i
            if start == 0:
                seq.prompt_logprobs = [None]
            assert seq.prompt_logprobs is not None
            seq.prompt_logprobs += prompt_logprobs(logits[:-1] if last else logits,
                                                   seq.prompt[start + 1 : start + len(tokens) + 1], top)
            logits = logits[-1]
        return sample(logits, seq) if last else None

    @torch.inference_mode()
    def prefill_logits(self, block: int, start: int, tokens: list[int], every_token: bool = False) -> torch.Tensor:
        """One prefill chunk into ``block``; the ``[vocab]`` logits of its last token (a prefill worker ships
        them so the decode side samples the first token with the request's own generator), or with
        ``every_token`` the ``[n, vocab]`` logits of each of its tokens (prompt logprobs)."""
        if every_token:
            self._require("every_token_logits", "prompt logprobs need every prompt token's logits")
        self._check_chunk(tokens)
        n, c = len(tokens), self.chunk
        ids = torch.zeros(1, c, dtype=torch.long)
        ids[0, :n] = torch.tensor(tokens)
        positions = torch.zeros(1, c, dtype=torch.long)
        positions[0, :n] = torch.arange(start, start + n)
        slots = torch.full((1, c), SCRATCH_BLOCK, dtype=torch.long)  # pad tokens write into the scratch block
        slots[0, :n] = block
        t0 = time.perf_counter()
        index = torch.arange(n)[None] if every_token else torch.tensor([n - 1])
        logits = self.backend.prefill(ids, positions, slots, torch.tensor([block]), index)
        self.forward_seconds += time.perf_counter() - t0
        return logits[0]

    @torch.inference_mode()
    def decode(self, batch: list[Sequence | None]) -> list[int | None]:
        self._require("decode", "a decode step")
        if len(batch) != self.lanes:
            raise ValueError(f"a decode batch has {self.lanes} lanes; got {len(batch)}")
        # Built from lists: one tensor each, not one small tensor write per lane.
        ids = torch.tensor([[0 if s is None else s.last_token] for s in batch], dtype=torch.long)
        positions = torch.tensor([[0 if s is None else s.computed] for s in batch], dtype=torch.long)
        blocks = torch.tensor([SCRATCH_BLOCK if s is None else s.block for s in batch], dtype=torch.long)
        masks = self._prepare_masks(batch)
        t0 = time.perf_counter()
        try:
            logits = self.backend.decode(ids, positions, blocks[:, None], blocks,
                                         torch.zeros(self.lanes, dtype=torch.long))
        finally:
            if masks is not None:
                masks.result()  # never raises (prepare_masks leaves a failing lane to its own sampling)
        self.forward_seconds += time.perf_counter() - t0
        return sample_batch(logits, batch)

    def _prepare_masks(self, batch: list[Sequence | None]) -> concurrent.futures.Future | None:
        """On a backend with a device of its own, the grammar lanes' masks are filled on a host thread while the
        device runs the step, so the matcher does not add to the step (on the cpu backend both would share the
        same cores: the masks are filled at sampling)."""
        if not self.capabilities.devices or not any(s is not None and s.params.grammar is not None for s in batch):
            return None
        if self._grammar_thread is None:
            self._grammar_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="atom-grammar")
        return self._grammar_thread.submit(prepare_masks, batch)

    @torch.inference_mode()
    def verify(self, batch: list[Sequence | None], drafts: list[list[int]]) -> list[list[int] | None]:
        """One decode step that also checks each lane's draft (:mod:`atom_engine.speculation`): a lane feeds its
        last token and its draft at positions ``seq.computed..``; it gets back the draft tokens the model's own
        argmax agrees with, in order up to the first that differs, then the model's next token. Greedy gives what
        one-token steps would; a lane with no draft samples its one token as a decode step does."""
        self._require("verify", "a decode step with drafts")
        self._check_drafts(batch, drafts)
        t = 1 + max(len(d) for d in drafts)
        ids, positions, slots = [], [], []
        for seq, draft in zip(batch, drafts, strict=True):
            if seq is None:  # an empty lane: all pads
                ids.append([0] * t)
                positions.append([0] * t)
                slots.append([SCRATCH_BLOCK] * t)
                continue
            n = 1 + len(draft)
            # Pads repeat the last real token's position and write into the scratch block: the lane's KV is not
            # touched past its draft, and their logits are never read.
            ids.append([seq.last_token, *draft] + [0] * (t - n))
            positions.append([seq.computed + j for j in range(n)] + [seq.computed + n - 1] * (t - n))
            slots.append([seq.block] * n + [SCRATCH_BLOCK] * (t - n))
        blocks = [SCRATCH_BLOCK if s is None else s.block for s in batch]
        t0 = time.perf_counter()
        logits = self.backend.verify(torch.tensor(ids), torch.tensor(positions), torch.tensor(slots),
                                     torch.tensor(blocks))  # [real tokens, vocab], lane by lane
        self.forward_seconds += time.perf_counter() - t0
        return self._accept(batch, drafts, logits)

    @torch.inference_mode()
    def mixed(self, batch: list[Sequence | None], drafts: list[list[int]],
              chunks: list[tuple[Sequence, int, list[int], bool]]) -> tuple[list[list[int] | None], list[int | None]]:
        """A decode step (as :meth:`verify`: each lane's last token and draft) and prefill chunks (as
        :meth:`prefill`: ``(seq, start, tokens, last)``, no prompt logprobs) in one forward, on a backend that
        ``mixes_prefill``: the weights are read once for both, instead of once more for every prefill. Returns
        verify's per-lane tokens and, per chunk, its prompt's first output token (None if not ``last``)."""
        self._require("mixed", "a decode step that carries prefill chunks")
        self._check_drafts(batch, drafts)
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        lanes: list[tuple[int, int]] = []
        parts: list[tuple[int, int]] = []
        for seq, draft in zip(batch, drafts, strict=True):
            if seq is not None:
                fed = [seq.last_token, *draft]
                lanes.append((seq.block, len(fed)))
                ids += fed
                positions += range(seq.computed, seq.computed + len(fed))
                slots += [seq.block] * len(fed)
        for seq, start, tokens, _ in chunks:
            self._check_chunk(tokens)
            if seq.params.prompt_logprobs is not None:
                raise ValueError("a chunk that scores its prompt (prompt logprobs) is prefilled on its own")
            parts.append((seq.block, len(tokens)))
            ids += tokens
            positions += range(start, start + len(tokens))
            slots += [seq.block] * len(tokens)
        t0 = time.perf_counter()
        logits = self.backend.mixed(torch.tensor(ids), torch.tensor(positions), torch.tensor(slots), lanes, parts)
        self.forward_seconds += time.perf_counter() - t0
        decoded = sum(count for _, count in lanes)
        firsts = [sample(logits[decoded + i], seq) if last else None
                  for i, (seq, _, _, last) in enumerate(chunks)]
        return self._accept(batch, drafts, logits), firsts

    def _require(self, capability: str, why: str) -> None:
        self.capabilities.require(self.backend.name, capability, why)

    def _check_chunk(self, tokens: list[int]) -> None:
        if not 0 < len(tokens) <= self.chunk:
            raise ValueError(f"a prefill chunk has 1..{self.chunk} tokens; got {len(tokens)}")

    def _check_drafts(self, batch: list[Sequence | None], drafts: list[list[int]]) -> None:
        if len(batch) != self.lanes or len(drafts) != self.lanes:
            raise ValueError(f"a decode batch has {self.lanes} lanes; got {len(batch)} and {len(drafts)} drafts")
        if any(d and (s is None or not s.params.takes_drafts) for s, d in zip(batch, drafts, strict=True)):
            raise ValueError("only greedy lanes take a draft (it is checked against the argmax, or the argmax under"
                             " the lane's grammar)")

    def _accept(self, batch: list[Sequence | None], drafts: list[list[int]], logits: torch.Tensor
                ) -> list[list[int] | None]:
        """Each lane's tokens from the flat ``logits`` of its fed tokens (lane by lane, in order): the draft
        tokens the argmax agrees with, then the model's own next token."""
        greedy = torch.argmax(logits, dim=-1).tolist()
        out: list[list[int] | None] = []
        row = 0  # the lane's first real token in the flat logits
        for seq, draft in zip(batch, drafts, strict=True):
            if seq is None:
                out.append(None)
                continue
            if not draft:
                out.append([greedy[row] if seq.params.plain_greedy else sample(logits[row], seq)])
            elif seq.params.grammar is not None:  # checked against the argmax under the grammar's mask
                out.append(verify_draft(logits[row : row + 1 + len(draft)], draft, seq))
            else:
                agreed = 0
                while agreed < len(draft) and draft[agreed] == greedy[row + agreed]:
                    agreed += 1
                out.append(draft[:agreed] + [greedy[row + agreed]])
            row += 1 + len(draft)
        return out

    @torch.inference_mode()
    def copy_block(self, src: int, dst: int) -> None:
        self.backend.copy_block(src, dst)

    # -- for PD disaggregation: one block's KV (positions start..end) out of and into the backend's cache -----
    @torch.inference_mode()
    def load_kv(self, seq: Sequence, loaded: LoadedKV) -> int:
        """A shipment into the lane's block, and the first output token from its logits (the request's own
        generator, so seeded sampling is the same as after a local prefill)."""
        self.import_kv(seq.block, loaded.start, loaded.k, loaded.v)
        if seq.params.prompt_logprobs is not None:  # scored by the worker (the whole prompt: no cache lookup)
            seq.prompt_logprobs = loaded.prompt_logprobs
        return sample(loaded.logits, seq)

    @torch.inference_mode()
    def export_kv(self, block: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_span(block, start, end)
        return self.backend.export_kv(block, start, end)

    @torch.inference_mode()
    def import_kv(self, block: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        cfg = self.model.cfg
        want = (cfg.num_layers, cfg.num_kv_heads, k.shape[2] if k.dim() == 4 else -1, cfg.head_dim)
        for name, t in (("k", k), ("v", v)):
            if tuple(t.shape) != want or t.dtype != self.model.dtype:
                raise ValueError(f"imported {name} is {tuple(t.shape)} {t.dtype}; this engine takes"
                                 f" [layers, kv_heads, tokens, head_dim] = {list(want)} {self.model.dtype}")
        self._check_span(block, start, start + k.shape[2])
        self.backend.import_kv(block, start, k, v)

    def _check_span(self, block: int, start: int, end: int) -> None:
        if not 0 <= block < self.kv_blocks or not 0 <= start <= end <= self.model.max_seq_len:
            raise ValueError(f"KV span block {block} positions {start}..{end} is outside kvBlocks={self.kv_blocks},"
                             f" maxSeqLen={self.model.max_seq_len}")
