"""A plain torch Llama-family decoder (Llama, Qwen2, Mistral without sliding window) over a block KV cache.

The KV cache is two preallocated tensors (K and V), each ``[layers, kv_blocks, kv_heads, max_seq_len, head_dim]``,
owned by the runner and passed in, so one forward serves both graphs with static shapes:

- decode: ``[lanes, 1]`` tokens, one block per lane (empty lanes point at the scratch block); a speculative step
  on an eager backend feeds a few tokens per lane, flat (``counts``, ``Ragged``), and may carry prefill chunks
  after them (``chunks``, ``Mixed``);
- prefill: ``[1, chunk]`` tokens of one sequence, padded to the chunk size (pad tokens write to the scratch block).

Eager backends pass ``rows`` (each row's block and length) to attend over views of the cache instead of gathering
whole blocks (``RowViews``, ``BlockSpan``, ``Ragged``), and may ``pack()`` the weights for few-row matmuls
(``packed.py``); the static-shape graph uses neither.

Module names follow the Hugging Face checkpoints, so a ``state_dict`` loads as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from atom_engine import limits
from atom_engine.model.config import ModelConfig
from atom_engine.model.packed import PackedLinear


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, x.shape[-1:], self.weight, eps=self.eps)  # one op, the same bits as below
        # Normalise in float32 as HF does (even for float64 weights), so the two agree token for token.
        return self.weight * F.rms_norm(x.to(torch.float32), x.shape[-1:], eps=self.eps).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor:
    """A few query tokens per row (``q``: [B, H, T, D], T = 1 for plain decode) over [B, KVH, S, D]: the H / KVH
    query heads that share a KV head go in as that head's queries (``[B, KVH, H / KVH * T, D]``, the order
    ``enable_gqa`` pairs them in; ``mask`` then has a row per head and token), so the kernel reads each KV head once
    and no KV is repeated. The same sums as SDPA with ``enable_gqa``; on SmolLM2's decode (8 rows x 260 positions,
    9 / 3 heads, one thread) 240 us a layer against 400 us in float32, and 310 us against 2.9 ms in bfloat16, whose
    GQA path is not vectorised. Prefill (long T) gains nothing this way."""
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
    dropped. One attention call per layer instead of one per row: on the benchmark's 8 lanes of 200-300 tokens one
    call takes about 90 us against 8 x 18 us row by row, and the decode step about 8 % less time. A speculative
    step (a few tokens per row, :mod:`atom_engine.speculation`) spans the same way."""

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


def causal_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """``[B, 1, T, kv_len]`` bool: each token may attend to the positions up to its own."""
    key_pos = torch.arange(kv_len, device=positions.device)
    return (key_pos[None, None, :] <= positions[:, :, None])[:, None]


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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.qkv: PackedLinear | None = None  # set by pack()
        self.o: PackedLinear | None = None

    def pack(self, onednn: bool | None) -> None:
        self.qkv = PackedLinear(self.q_proj, self.k_proj, self.v_proj, onednn=onednn)
        self.o = PackedLinear(self.o_proj, onednn=onednn)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, hidden]
        cos: torch.Tensor,  # [B, T, 1, head_dim]
        sin: torch.Tensor,
        k_cache: torch.Tensor,  # [kv_blocks, kv_heads, S, head_dim] of this layer
        v_cache: torch.Tensor,
        slot_blocks: torch.Tensor,  # [B, T]: where each token's K/V is written
        positions: torch.Tensor,  # [B, T]
        attn_blocks: torch.Tensor,  # [B]: the block each row attends over
        mask: torch.Tensor | None,  # [B, 1, T, S] bool: may attend
        layer: int,
        eager: RowViews | BlockSpan | Ragged | Mixed | None = None,  # eager only, see LlamaForCausalLM.forward
    ) -> torch.Tensor:
        b, t, _ = x.shape
        h, kvh = self.num_heads, self.num_kv_heads
        if self.qkv is None:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        else:
            qkv = self.qkv(x)
        qkv = qkv.view(b, t, h + 2 * kvh, self.head_dim)
        qk = qkv[:, :, : h + kvh]  # RoPE turns queries and keys in one go
        qk = qk * cos + rotate_half(qk) * sin
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kvh :]
        # Write first, then read the whole block: the new tokens attend to themselves through the cache.
        k_cache[slot_blocks, :, positions] = k
        v_cache[slot_blocks, :, positions] = v
        q = q.transpose(1, 2)  # [B, H, T, D]
        if eager is None:
            # Static shapes: gather every row's whole block and mask what it may not see.
            keys, values = k_cache[attn_blocks], v_cache[attn_blocks]  # [B, KVH, S, D]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        else:
            out = eager.attend(q, layer)
        out = out.transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out) if self.o is None else self.o(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.gate_up: PackedLinear | None = None  # set by pack()
        self.down: PackedLinear | None = None

    def pack(self, onednn: bool | None) -> None:
        self.gate_up = PackedLinear(self.gate_proj, self.up_proj, onednn=onednn)
        self.down = PackedLinear(self.down_proj, onednn=onednn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_seq_len: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.max_seq_len = max_seq_len
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.head: PackedLinear | None = None  # set by pack()
        # As HF: angles in float32, cast to the model dtype afterwards.
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float) / cfg.head_dim))
        freqs = torch.arange(max_seq_len, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype  # the embedding is never packed away

    def pack(self, onednn: bool | None = None) -> None:
        """Move the linears' weights into :class:`PackedLinear` for the eager path (the cpu backend); the
        compiled graphs never pack. Packed linears release their dense weights. Idempotent."""
        if self.head is not None:  # set last, so it says the whole model is packed
            return
        for layer in self.model.layers:
            layer.self_attn.pack(onednn)
            layer.mlp.pack(onednn)
        self.head = PackedLinear(self.lm_head, shared=self.cfg.tie_word_embeddings, onednn=onednn)

    def kv_shape(self, kv_blocks: int) -> tuple[int, int, int, int, int]:
        c = self.cfg
        return (c.num_layers, kv_blocks, c.num_kv_heads, self.max_seq_len, c.head_dim)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T]
        slot_blocks: torch.Tensor,  # [B, T]
        attn_blocks: torch.Tensor,  # [B]
        logits_index: torch.Tensor,  # [B]: which of the T tokens to return logits for
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        rows: list[tuple[int, int]] | None = None,
        counts: list[int] | None = None,
        chunks: list[tuple[int, int]] | None = None,
    ) -> torch.Tensor:
        """``rows`` (eager backends): each row's block and length. ``counts`` (eager, a speculative step): the
        tokens come flat, ``[1, N]``, ``counts[r]`` of them for row r in turn (see Ragged). ``chunks`` (eager,
        with ``counts``): prefill chunks whose tokens follow the rows' (each one's block and token count; see
        Mixed)."""
        dtype = self.dtype
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(dtype).unsqueeze(2)  # [B, T, 1, head_dim]: broadcast over heads
        sin = self.rope_sin[positions].to(dtype).unsqueeze(2)
        # Static shapes: every row's whole block, masked. Eager: attend over views of the cache (no gather of whole
        # blocks); see RowViews, BlockSpan and Ragged.
        mask = causal_mask(positions, k_cache.shape[-2]) if rows is None else None
        group = self.cfg.num_heads // self.cfg.num_kv_heads
        eager: RowViews | BlockSpan | Ragged | Mixed | None = None
        if rows is not None:
            if chunks:
                eager = Mixed(k_cache, v_cache, rows, positions, group, counts or [], chunks)
            elif counts is None:
                eager = padded_attention(k_cache, v_cache, rows, positions, group)
            else:
                eager = Ragged(k_cache, v_cache, rows, positions, group, counts)
        for i, layer in enumerate(self.model.layers):
            h = layer.input_layernorm(x)
            x = x + layer.self_attn(h, cos, sin, k_cache[i], v_cache[i], slot_blocks, positions, attn_blocks, mask,
                                    i, eager)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        rows_of = torch.arange(x.shape[0], device=x.device)
        if logits_index.dim() == 2:  # [B, K]: K tokens per row (prompt logprobs): [B, K, hidden]
            rows_of = rows_of[:, None]
        x = self.model.norm(x[rows_of, logits_index])  # [B, hidden]
        return self.lm_head(x) if self.head is None else self.head(x)
