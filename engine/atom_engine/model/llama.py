"""A plain torch Llama-family decoder (Llama, Qwen2, Mistral without sliding window) over a block KV cache.

The KV cache is two preallocated tensors (K and V), each ``[layers, kv_blocks, kv_heads, max_seq_len, head_dim]``,
owned by the runner and passed in, so one forward serves both graphs with static shapes:

- decode: ``[lanes, 1]`` tokens, one block per lane (empty lanes point at the scratch block);
- prefill: ``[1, chunk]`` tokens of one sequence, padded to the chunk size (pad tokens write to the scratch block).

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
        dtype = x.dtype
        # Normalise in float32 as HF does (even for float64 weights), so the two agree token for token.
        return self.weight * F.rms_norm(x.to(torch.float32), x.shape[-1:], eps=self.eps).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, hidden]
        cos: torch.Tensor,  # [B, T, head_dim]
        sin: torch.Tensor,
        k_cache: torch.Tensor,  # [kv_blocks, kv_heads, S, head_dim] of this layer
        v_cache: torch.Tensor,
        slot_blocks: torch.Tensor,  # [B, T]: where each token's K/V is written
        positions: torch.Tensor,  # [B, T]
        attn_blocks: torch.Tensor,  # [B]: the block each row attends over
        mask: torch.Tensor,  # [B, 1, T, S] bool: may attend
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # Write first, then read the whole block: the new tokens attend to themselves through the cache.
        k_cache[slot_blocks, :, positions] = k
        v_cache[slot_blocks, :, positions] = v
        keys = k_cache[attn_blocks]  # [B, KVH, S, D]
        values = v_cache[attn_blocks]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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
        # As HF: angles in float32, cast to the model dtype afterwards.
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float) / cfg.head_dim))
        freqs = torch.arange(max_seq_len, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

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
    ) -> torch.Tensor:
        dtype = self.lm_head.weight.dtype
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(dtype)
        sin = self.rope_sin[positions].to(dtype)
        # The caches may be a prefix of max_seq_len positions (the cpu backend trims them to what is in use).
        key_pos = torch.arange(k_cache.shape[-2], device=positions.device)
        allowed = key_pos[None, None, :] <= positions[:, :, None]  # [B, T, S]
        mask = allowed[:, None]  # [B, 1, T, S]
        for i, layer in enumerate(self.model.layers):
            h = layer.input_layernorm(x)
            x = x + layer.self_attn(h, cos, sin, k_cache[i], v_cache[i], slot_blocks, positions, attn_blocks, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = x[torch.arange(x.shape[0], device=x.device), logits_index]  # [B, hidden]
        return self.lm_head(self.model.norm(x))
