"""A fake model for batcher tests: each block holds the tokens written at each position, and the next token is a
hash of the block's contents, so a wrong copy, a wrong position or a stale block changes the output."""

from __future__ import annotations

from collections.abc import Callable

from atom_engine.capabilities import Capabilities
from atom_engine.sequence import Sequence

VOCAB = 50


def next_token(context: list[int]) -> int:
    h = 7
    for t in context:
        h = (h * 31 + t + 1) % 1_000_003
    return h % VOCAB


def echo_token(context: list[int]) -> int:
    """A model that repeats its context with period 3: prompt lookup guesses it right from the first repeat."""
    return context[-3] if len(context) >= 3 else next_token(context)


def reference(prompt: list[int], max_tokens: int, eos: int | None = None,
              model: Callable[[list[int]], int] = next_token) -> list[int]:
    """What any correct batcher must produce for ``prompt`` (greedy, no other stop)."""
    ctx, out = list(prompt), []
    while len(out) < max_tokens:
        t = model(ctx)
        out.append(t)
        ctx.append(t)
        if t == eos:
            break
    return out


class FakeRunner:
    capabilities = Capabilities(verify=True)

    def __init__(self, kv_blocks: int, max_seq_len: int, lanes: int,
                 model: Callable[[list[int]], int] = next_token) -> None:
        self.blocks: list[list[int | None]] = [[None] * max_seq_len for _ in range(kv_blocks)]
        self.lanes = lanes
        self.model = model
        self.decode_calls: list[list[str | None]] = []
        self.verify_calls: list[list[list[int]]] = []  # the drafts of each speculative step
        self.prefill_calls: list[tuple[str, int, int]] = []  # (request id, start, n tokens)
        self.copies: list[tuple[int, int]] = []
        self.fault: Callable[[Sequence], bool] = lambda seq: False  # raise while serving these requests

    def _read(self, block: int, upto: int) -> list[int]:
        ctx = self.blocks[block][:upto]
        assert None not in ctx, f"block {block} has holes below position {upto}: {ctx}"
        return ctx  # type: ignore[return-value]

    def prefill(self, seq: Sequence, start: int, tokens: list[int], last: bool) -> int | None:
        if self.fault(seq):
            raise RuntimeError(f"injected fault in {seq.id}")
        self.prefill_calls.append((seq.id, start, len(tokens)))
        for i, t in enumerate(tokens):
            self.blocks[seq.block][start + i] = t
        return self.model(self._read(seq.block, start + len(tokens))) if last else None

    def decode(self, batch: list[Sequence | None]) -> list[int | None]:
        assert len(batch) == self.lanes
        self.decode_calls.append([s.id if s else None for s in batch])
        if any(s is not None and self.fault(s) for s in batch):
            raise RuntimeError("injected fault in the batch")
        out: list[int | None] = []
        for seq in batch:
            if seq is None:
                out.append(None)
                continue
            self.blocks[seq.block][seq.computed] = seq.tokens[-1]
            out.append(self.model(self._read(seq.block, seq.computed + 1)))
        return out

    def verify(self, batch: list[Sequence | None], drafts: list[list[int]]) -> list[list[int] | None]:
        """As ModelRunner.verify: each lane writes its last token and its draft (a real block has room for them:
        an IndexError here is a draft past maxSeqLen), and keeps the draft's agreeing head plus the next token."""
        assert len(batch) == self.lanes and len(drafts) == self.lanes
        self.verify_calls.append([list(d) for d in drafts])
        if any(s is not None and self.fault(s) for s in batch):
            raise RuntimeError("injected fault in the batch")
        out: list[list[int] | None] = []
        for seq, draft in zip(batch, drafts, strict=True):
            if seq is None:
                assert not draft
                out.append(None)
                continue
            assert not draft or seq.params.plain_greedy, "a draft for a lane that is not plain greedy"
            fed = [seq.tokens[-1], *draft]
            for i, t in enumerate(fed):
                self.blocks[seq.block][seq.computed + i] = t
            new = []
            for i in range(len(fed)):
                token = self.model(self._read(seq.block, seq.computed + i + 1))
                new.append(token)
                if i == len(draft) or token != draft[i]:
                    break
            out.append(new)
        return out

    def copy_block(self, src: int, dst: int) -> None:
        self.copies.append((src, dst))
        self.blocks[dst] = list(self.blocks[src])


class MixingFakeRunner(FakeRunner):
    """A runner that, as the cpu backend, takes prefill chunks into the decode step's forward (``mixed``)."""

    capabilities = Capabilities(verify=True, mixed=True)

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.mixed_calls: list[tuple[list[str | None], list[tuple[str, int, int]]]] = []  # (lanes, chunks)

    def mixed(self, batch: list[Sequence | None], drafts: list[list[int]],
              chunks: list[tuple[Sequence, int, list[int], bool]]) -> tuple[list[list[int] | None], list[int | None]]:
        """As ModelRunner.mixed: one forward for the step and the chunks; a fault anywhere fails all of it."""
        assert len(batch) == self.lanes and chunks
        assert all(seq.params.prompt_logprobs is None for seq, _, _, _ in chunks), "a scoring chunk rode along"
        assert all(seq is not s for seq, _, _, _ in chunks for s in batch), "a lane both decodes and prefills"
        if any(self.fault(seq) for seq, _, _, _ in chunks) or any(s is not None and self.fault(s) for s in batch):
            raise RuntimeError("injected fault in the mixed step")
        self.mixed_calls.append(([s.id if s else None for s in batch], [(q.id, st, len(t)) for q, st, t, _ in chunks]))
        firsts: list[int | None] = []
        for seq, start, tokens, last in chunks:
            for i, t in enumerate(tokens):
                self.blocks[seq.block][start + i] = t
            firsts.append(self.model(self._read(seq.block, start + len(tokens))) if last else None)
        calls = len(self.verify_calls)
        news = self.verify(batch, drafts)
        del self.verify_calls[calls:]  # counted as a mixed call
        return news, firsts
