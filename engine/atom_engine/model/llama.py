"""A plain torch Llama-family decoder (Llama, Qwen2, Mistral without sliding window) over a block KV cache.

The KV cache is two preallocated tensors (K and V), each ``[layers, kv_blocks, kv_heads, max_seq_len, head_dim]``,
owned by the runner and passed in, so one forward serves both graphs with static shapes:

- decode: ``[lanes, 1]`` tokens, one block per lane (empty lanes point at the scratch block);
- prefill: ``[1, chunk]`` tokens of one sequence, padded to the chunk size (pad tokens write to the scratch block).

How the queries read the cache is the caller's :class:`AttentionStrategy`: :class:`StaticAttention` (every row's
whole block, masked) for the compiled graphs; the cpu backend's eager strategies attend over views of the cache
(``atom_engine.backends.cpu_attention``) and ``pack()`` the weights for few-row matmuls (``packed.py``).

Module names follow the Hugging Face checkpoints, so a ``state_dict`` loads as is.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

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


class AttentionStrategy(Protocol):
    """How one forward's queries read the KV cache (after the layer wrote its new tokens' K/V). Built once per
    forward by whoever runs the model: :class:`StaticAttention` for the static-shape graphs, the cpu backend's
    eager strategies (``atom_engine.backends.cpu_attention``) on host tensors."""

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """``q`` ``[B, H, T, D]`` of layer ``layer`` -> the attention output, the same shape."""


def causal_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """``[B, 1, T, kv_len]`` bool: each token may attend to the positions up to its own."""
    key_pos = torch.arange(kv_len, device=positions.device)
    return (key_pos[None, None, :] <= positions[:, :, None])[:, None]


class StaticAttention:
    """Static shapes: gather every row's whole block and mask what it may not see (the compiled graphs)."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, attn_blocks: torch.Tensor,
                 positions: torch.Tensor) -> None:
        self.k_cache, self.v_cache, self.attn_blocks = k_cache, v_cache, attn_blocks
        self.mask = causal_mask(positions, k_cache.shape[-2])  # [B, 1, T, S] bool: may attend

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        keys, values = self.k_cache[layer][self.attn_blocks], self.v_cache[layer][self.attn_blocks]  # [B, KVH, S, D]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=self.mask, enable_gqa=True)


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
        attention: AttentionStrategy,
        layer: int,
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
        out = attention.attend(q.transpose(1, 2), layer).transpose(1, 2).reshape(b, t, -1)  # q: [B, H, T, D]
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
        slot_blocks: torch.Tensor,  # [B, T]: where each token's K/V is written
        logits_index: torch.Tensor,  # [B] or [B, K]: which of the T tokens to return logits for
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        attention: AttentionStrategy,
    ) -> torch.Tensor:
        """The logits of the ``logits_index`` tokens; ``attention``: how the queries read the cache."""
        dtype = self.dtype
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(dtype).unsqueeze(2)  # [B, T, 1, head_dim]: broadcast over heads
        sin = self.rope_sin[positions].to(dtype).unsqueeze(2)
        for i, layer in enumerate(self.model.layers):
            h = layer.input_layernorm(x)
            x = x + layer.self_attn(h, cos, sin, k_cache[i], v_cache[i], slot_blocks, positions, attention, i)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        rows_of = torch.arange(x.shape[0], device=x.device)
        if logits_index.dim() == 2:  # [B, K]: K tokens per row (prompt logprobs): [B, K, hidden]
            rows_of = rows_of[:, None]
        x = self.model.norm(x[rows_of, logits_index])  # [B, hidden]
        return self.lm_head(x) if self.head is None else self.head(x)
