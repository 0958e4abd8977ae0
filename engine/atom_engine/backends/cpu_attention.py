"""The cpu backend's attention: eager strategies over views of the KV cache (no whole blocks gathered), chosen per
forward from what it computes (:class:`CpuAttention`, built once when the backend loads):

- a prefill chunk or a decode step: :func:`padded_attention` (one call over blocks that lie close together,
  :class:`BlockSpan`, else :class:`RowViews`, row by row);
- a speculative step, a few tokens per lane laid out flat: :class:`Ragged`;
- a decode step carrying prefill chunks: :class:`Mixed`.

Each implements :class:`atom_engine.model.llama.AttentionStrategy`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_engine import limits
from atom_engine.model.llama import AttentionStrategy, causal_mask


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor:
    """A few query tokens per row (``q``: [B, H, T, D], T = 1 for plain decode) over [B, KVH, S, D]: the H / KVH
    query heads that share a KV head go in as that head's queries (``[B, KVH, H / KVH * T, D]``, the order
    ``enable_gqa`` pairs them in; ``mask`` then has a row per head and token), so the kernel reads each KV head once
    and no KV is repeated. The same sums as SDPA with ``enable_gqa``, faster on decode in float32 and far faster in
    bfloat16, whose GQA path is not vectorised (benchmarks/results/measured-in-place.md). Prefill (long T) gains
    nothing this way."""
    b, h, t, d = q.shape
    kvh = keys.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(b, kvh, h // kvh * t, d), keys, values, attn_mask=mask)
    return out.view(b, h, t, d)


class RowViews:
    """Eager attention, row by row: each row attends over views of its own block cut to its own length
    (``[layers, 1, KVH, n, D]``), so no KV is copied and no row pays for a longer neighbour."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: list[tuple[int, int]],
                 mask: torch.Tensor | None) -> None:
        # A decode row (T == 1) sees all of its positions: no mask. Additive, built once per step: SDPA would turn
        # a bool mask into this in every layer.
        if mask is not None:
            mask = torch.zeros(mask.shape, dtype=k_cache.dtype).masked_fill_(~mask, float("-inf"))
        self.views = [
            (k_cache[:, blk, None, :, :n], v_cache[:, blk, None, :, :n],
             None if mask is None else mask[r : r + 1, :, :, :n])
            for r, (blk, n) in enumerate(rows)
        ]

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:  # q: [B, H, T, D]
        if q.shape[2] == 1:
            return torch.cat([decode_attention(q_row, keys[layer], values[layer], None)
                              for q_row, (keys, values, _) in zip(q.split(1), self.views, strict=True)])
        return torch.cat([
            F.scaled_dot_product_attention(q_row, keys[layer], values[layer], attn_mask=row_mask, enable_gqa=True)
            for q_row, (keys, values, row_mask) in zip(q.split(1), self.views, strict=True)
        ])


class BlockSpan:
    """Eager decode attention in one call: the rows' blocks lie close together in the cache, so one view of the
    blocks ``lo..hi`` cut to the longest row (no KV copied) serves every row at once. Each row's queries go to its
    own block; a mask hides the positions past each query's own (a row's later tokens, its block's stale tail);
    blocks of the span that no row holds (free or cached) get a copy of some row's queries and their output is
    dropped. One attention call per layer instead of one per row: the call costs less than the rows' calls together,
    and the decode step is shorter (benchmarks/results/measured-in-place.md). A speculative step (a few tokens per
    row, :mod:`atom_engine.speculation`) spans the same way."""

    # A span of at most twice as many blocks as rows; wider, the padded work would grow past the calls saved (a
    # judgement: only spans of full 8-lane batches were measured).
    MAX_BLOCKS_PER_ROW = 2
    # Tokens per row: decode's one, or a speculative step's few. A prefill chunk (one row) keeps the row path.
    MAX_TOKENS = 1 + limits.SPECULATIVE_TOKENS_MAX

    @classmethod
    def fits(cls, rows: list[tuple[int, int]], t: int = 1) -> bool:
        if t > 1 and (t > cls.MAX_TOKENS or len(rows) < 2):
            return False
        blocks = [blk for blk, _ in rows]
        return len(set(blocks)) == len(blocks) and max(blocks) - min(blocks) < cls.MAX_BLOCKS_PER_ROW * len(rows)

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: list[tuple[int, int]],
                 positions: torch.Tensor | None = None, group: int = 1) -> None:
        """``positions`` ``[B, T]``: each query's position (None: one query per row, at its row's last position);
        ``group``: query heads per KV head (the mask has a row per head and token when T > 1)."""
        blocks = [blk for blk, _ in rows]
        lo, hi, width = min(blocks), max(blocks), max(n for _, n in rows)
        self.keys, self.values = k_cache[:, lo : hi + 1, :, :width], v_cache[:, lo : hi + 1, :, :width]
        t = 1 if positions is None else positions.shape[1]
        # Blocks no row holds see every position: their output is dropped.
        seen = torch.full((hi + 1 - lo, t), width - 1, dtype=torch.long)
        query_of = [0] * (hi + 1 - lo)
        for r, (blk, n) in enumerate(rows):
            query_of[blk - lo] = r
            seen[blk - lo] = n - 1 if positions is None else positions[r]
        self.query_of = torch.tensor(query_of)
        self.block_of = torch.tensor([blk - lo for blk in blocks])
        hidden = torch.arange(width)[None, None, :] > seen[:, :, None]  # [blocks, T, width]
        if t > 1:  # rows ordered (head, token), as decode_attention lays the queries out
            hidden = hidden.repeat(1, group, 1)
        # Additive, built once per step: SDPA would turn a bool mask into this in every layer.
        self.mask = torch.zeros(hidden.shape, dtype=k_cache.dtype).masked_fill_(hidden, float("-inf"))[:, None]

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:  # q: [B, H, T, D]
        return decode_attention(q[self.query_of], self.keys[layer], self.values[layer], self.mask)[self.block_of]


class Ragged:
    """A speculative step's tokens laid out flat (``[1, N]``: row r's ``counts[r]`` tokens in turn), so the
    linears multiply only real tokens (lanes' drafts differ in length), while attention sees them as padded rows
    ``[B, H, T, D]`` (a pad repeats its row's last token; its output is dropped), through a BlockSpan or RowViews
    built for the padded positions. Through a BlockSpan the queries go straight from the flat tokens to the span's
    blocks and the outputs straight back, one gather each way (padding, the span's rows and back would be four
    gathers and two copies a layer)."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: list[tuple[int, int]],
                 positions: torch.Tensor, group: int, counts: list[int]) -> None:
        self.rows, self.t = len(counts), max(counts)
        pad_index, real_index, start = [], [], 0
        for r, c in enumerate(counts):
            pad_index += [start + min(j, c - 1) for j in range(self.t)]
            real_index += [r * self.t + j for j in range(c)]
            start += c
        self.pad_index, self.real_index = torch.tensor(pad_index), torch.tensor(real_index)
        padded = positions[0, self.pad_index].view(self.rows, self.t)
        self.inner = padded_attention(k_cache, v_cache, rows, padded, group)
        if isinstance(self.inner, BlockSpan):
            heads = torch.arange(group * k_cache.shape[2])
            # Span block j's token t is flat token pad_index[query_of[j], t]: q[0][heads, that] is [blocks, H, T, D].
            self.heads_in = heads[None, :, None]
            self.tokens_in = self.pad_index.view(self.rows, self.t)[self.inner.query_of][:, None, :]
            # Flat token i (row r, token t) is the span's output [block_of[r], :, t]: [N, H, D].
            row_of = torch.repeat_interleave(torch.arange(self.rows), torch.tensor(counts))
            self.blocks_out = self.inner.block_of[row_of][:, None]
            self.heads_out = heads[None, :]
            self.tokens_out = (self.real_index - row_of * self.t)[:, None]

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:  # q: [1, H, N, D]
        h, d = q.shape[1], q.shape[3]
        if isinstance(self.inner, BlockSpan):
            span = self.inner
            out = decode_attention(q[0][self.heads_in, self.tokens_in], span.keys[layer], span.values[layer],
                                   span.mask)  # [blocks, H, T, D]
            return out[self.blocks_out, self.heads_out, self.tokens_out][None].transpose(1, 2)  # [1, H, N, D]
        padded = q[0, :, self.pad_index].view(h, self.rows, self.t, d).transpose(0, 1)  # [B, H, T, D]
        out = self.inner.attend(padded, layer).transpose(0, 1).reshape(h, self.rows * self.t, d)
        return out[:, self.real_index][None]


class Mixed:
    """A decode step's flat tokens (``counts`` per row, as :class:`Ragged`) followed by whole prefill chunks
    (``chunks``: each one's block and token count), in one forward: the linears read the weights once for both,
    while attention stays apart: the decode rows through a Ragged, each chunk causally over its own block as a
    prefill does (RowViews). The outputs go back in the same flat order."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: list[tuple[int, int]],
                 positions: torch.Tensor, group: int, counts: list[int], chunks: list[tuple[int, int]]) -> None:
        self.decoded = sum(counts)
        self.decode = Ragged(k_cache, v_cache, rows, positions[:, : self.decoded], group, counts) if counts else None
        self.chunks: list[tuple[int, int, RowViews]] = []
        at = self.decoded
        for block, n in chunks:
            chunk_positions = positions[:, at : at + n]
            end = int(chunk_positions[0, -1]) + 1
            self.chunks.append((at, n, RowViews(k_cache, v_cache, [(block, end)], causal_mask(chunk_positions, end))))
            at += n

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:  # q: [1, H, N, D]
        parts = [] if self.decode is None else [self.decode.attend(q[:, :, : self.decoded], layer)]
        parts += [views.attend(q[:, :, at : at + n], layer) for at, n, views in self.chunks]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def padded_attention(k_cache: torch.Tensor, v_cache: torch.Tensor, rows: list[tuple[int, int]],
                     positions: torch.Tensor, group: int) -> RowViews | BlockSpan:
    """Attention over ``rows`` (each row's block and length) for tokens at ``positions`` ``[B, T]``: one call when
    the rows' blocks lie close together, else row by row."""
    t = positions.shape[1]
    if BlockSpan.fits(rows, t):
        return BlockSpan(k_cache, v_cache, rows, positions if t > 1 else None, group)
    mask = None if t == 1 else causal_mask(positions, max(n for _, n in rows))
    return RowViews(k_cache, v_cache, rows, mask)


class CpuAttention:
    """The strategy for each kind of forward the cpu backend runs (``rows``: each row's block and length)."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, group: int) -> None:
        self.k_cache, self.v_cache, self.group = k_cache, v_cache, group  # group: query heads per KV head

    def padded(self, rows: list[tuple[int, int]], positions: torch.Tensor) -> AttentionStrategy:
        """Rows of ``positions.shape[1]`` tokens each (a prefill chunk, a decode step)."""
        return padded_attention(self.k_cache, self.v_cache, rows, positions, self.group)

    def ragged(self, rows: list[tuple[int, int]], positions: torch.Tensor, counts: list[int]) -> AttentionStrategy:
        """A speculative step: ``counts[r]`` tokens of row r in turn, flat (``positions`` ``[1, N]``)."""
        return Ragged(self.k_cache, self.v_cache, rows, positions, self.group, counts)

    def mixed(self, rows: list[tuple[int, int]], positions: torch.Tensor, counts: list[int],
              chunks: list[tuple[int, int]]) -> AttentionStrategy:
        """A decode step's flat tokens, then whole prefill chunks (each one's block and token count)."""
        return Mixed(self.k_cache, self.v_cache, rows, positions, self.group, counts, chunks)
