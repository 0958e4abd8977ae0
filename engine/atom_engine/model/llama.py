"""A plain torch Llama-family decoder (Llama, Qwen2, Mistral without sliding window) over a block KV cache.

The KV cache is two preallocated tensors (K and V), each ``[layers, kv_blocks, kv_heads, max_seq_len, head_dim]``,
owned by the runner and passed in, so one forward serves both graphs with static shapes:

- decode: ``[lanes, 1]`` tokens, one block per lane (empty lanes point at the scratch block);
- prefill: ``[1, chunk]`` tokens of one sequence, padded to the chunk size (pad tokens write to the scratch block).

Eager backends pass ``rows`` (each row's block and length) to attend over views of the cache instead of gathering
whole blocks, and may ``pack()`` the weights for batched matmuls; the static-shape graph uses neither.

Module names follow the Hugging Face checkpoints, so a ``state_dict`` loads as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from atom_engine.model.config import ModelConfig


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


def pack_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One ``[in, sum(out)]`` weight for linears that read the same input, and their concatenated bias.

    One wide matmul over a weight laid out ``[in, out]`` streams memory better than several ``F.linear`` calls
    when the batch is a few rows (decode). Each linear's weight becomes a view into the packed tensor, so the
    state dict still reads as the checkpoint and the weights are not held twice.
    """
    with torch.no_grad():
        packed = torch.cat([lin.weight for lin in linears]).t().contiguous()
        biases = [lin.bias for lin in linears]
        bias = None if biases[0] is None else torch.cat(biases)
        col = 0
        for lin in linears:
            n = lin.out_features
            lin.weight = nn.Parameter(packed[:, col : col + n].t(), requires_grad=False)
            col += n
    return packed, bias


def matmul_packed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is None:
        return torch.matmul(x, weight)
    return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight).view(*x.shape[:-1], weight.shape[1])


# An eager row's K and V views over all layers (``[layers, 1, KVH, n, D]``) and its mask (None for decode).
RowView = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by pack()
        self.o: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def pack(self) -> None:
        self.qkv = pack_linears(self.q_proj, self.k_proj, self.v_proj)
        self.o = pack_linears(self.o_proj)

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
        row_views: list[RowView] | None = None,  # eager only, see LlamaForCausalLM.forward
    ) -> torch.Tensor:
        b, t, _ = x.shape
        h, kvh = self.num_heads, self.num_kv_heads
        if self.qkv is None:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        else:
            qkv = matmul_packed(x, *self.qkv)
        qkv = qkv.view(b, t, h + 2 * kvh, self.head_dim)
        qk = qkv[:, :, : h + kvh]  # RoPE turns queries and keys in one go
        qk = qk * cos + rotate_half(qk) * sin
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kvh :]
        # Write first, then read the whole block: the new tokens attend to themselves through the cache.
        k_cache[slot_blocks, :, positions] = k
        v_cache[slot_blocks, :, positions] = v
        q = q.transpose(1, 2)  # [B, H, T, D]
        if row_views is None:
            # Static shapes: gather every row's whole block and mask what it may not see.
            keys, values = k_cache[attn_blocks], v_cache[attn_blocks]  # [B, KVH, S, D]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        else:
            out = torch.cat([
                F.scaled_dot_product_attention(q_row, keys[layer], values[layer], attn_mask=row_mask, enable_gqa=True)
                for q_row, (keys, values, row_mask) in zip(q.split(1), row_views, strict=True)
            ])
        out = out.transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out) if self.o is None else matmul_packed(out, *self.o)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.gate_up: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by pack()
        self.down: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def pack(self) -> None:
        self.gate_up = pack_linears(self.gate_proj, self.up_proj)
        self.down = pack_linears(self.down_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = matmul_packed(x, *self.gate_up).chunk(2, dim=-1)
        return matmul_packed(F.silu(gate) * up, *self.down)


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
        self.head: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by pack()
        # As HF: angles in float32, cast to the model dtype afterwards.
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float) / cfg.head_dim))
        freqs = torch.arange(max_seq_len, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    def pack(self) -> None:
        """Lay the weights out for eager batched matmuls (see ``pack_linears``); the compiled graphs do not
        need it. A tied head stays as it is: it shares its weight with the embedding lookup. Idempotent."""
        if self.model.layers[0].mlp.down is not None:
            return
        for layer in self.model.layers:
            layer.self_attn.pack()
            layer.mlp.pack()
        if not self.cfg.tie_word_embeddings:
            self.head = pack_linears(self.lm_head)

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
    ) -> torch.Tensor:
        dtype = self.lm_head.weight.dtype
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(dtype).unsqueeze(2)  # [B, T, 1, head_dim]: broadcast over heads
        sin = self.rope_sin[positions].to(dtype).unsqueeze(2)
        mask = None
        if rows is None or input_ids.shape[1] > 1:
            kv_len = k_cache.shape[-2] if rows is None else max(n for _, n in rows)
            key_pos = torch.arange(kv_len, device=positions.device)
            mask = (key_pos[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, kv_len]
        row_views = None
        if rows is not None:
            # Eager: each row attends over views of its own block cut to its own length, so no KV is copied and no
            # row pays for a longer neighbour. A decode row (T == 1) sees all of its positions: no mask.
            row_views = [
                (k_cache[:, blk, None, :, :n], v_cache[:, blk, None, :, :n],  # [layers, 1, KVH, n, D]
                 None if mask is None else mask[r : r + 1, :, :, :n])
                for r, (blk, n) in enumerate(rows)
            ]
        for i, layer in enumerate(self.model.layers):
            h = layer.input_layernorm(x)
            x = x + layer.self_attn(h, cos, sin, k_cache[i], v_cache[i], slot_blocks, positions, attn_blocks, mask,
                                    i, row_views)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.model.norm(x[torch.arange(x.shape[0], device=x.device), logits_index])  # [B, hidden]
        return self.lm_head(x) if self.head is None else matmul_packed(x, *self.head)
