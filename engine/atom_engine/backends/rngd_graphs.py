"""The prefill graph in the form FuriosaAI's compiler (furiosa-torch) accepts.

The same model and the same static shapes as :class:`atom_engine.backends.graphs.ForwardGraph` (prefill
``[1, chunk]``, pad tokens write into the scratch block), written with four rewrites the compiler needs; each keeps
the logits and the KV equal to the shared form up to rounding (``tests/engine/test_rngd_graphs.py``):

1. the causal mask compares int32 positions, not int64;
2. each layer's new K and V are written with one flat ``index_copy_`` into ``cache.view(-1, head_dim)`` instead of
   an advanced-index assignment;
3. the KV cache is one K and one V tensor per layer (``[kv_blocks, kv_heads, max_seq_len, head_dim]`` each, the
   layout ``furiosa/torch/ext/transformers.py:79-88`` keeps on the device), not one 5-D tensor sliced per layer;
4. attention is plain matmul, ``torch.where(mask, s, -inf)``, softmax, matmul, over a ``[kv_heads, group]`` view
   of the queries, instead of SDPA and a transpose/reshape of its output.

The cpu backend keeps its own eager form (views of the cache cut to each row's length, packed weights): the
static form attends over whole blocks and would make it slower. Scores and softmax run in float32 whatever the
model dtype, as the CPU's SDPA kernels accumulate, so a bfloat16 model picks the same tokens on both paths.
"""

from __future__ import annotations

import torch
from torch import nn

from atom_engine.model.llama import Attention, LlamaForCausalLM, rotate_half


class RngdForwardGraph(nn.Module):
    """``forward(input_ids, positions, slot_blocks, attn_blocks, logits_index, k_0, v_0, k_1, v_1, ...)``:
    writes the tokens' KV into the per-layer caches in place and returns the ``[B, vocab]`` logits."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__()
        self.model = model
        cfg = model.cfg
        self.num_layers = cfg.num_layers
        self.scale = cfg.head_dim**-0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_blocks: torch.Tensor,
                attn_blocks: torch.Tensor, logits_index: torch.Tensor, *kv: torch.Tensor) -> torch.Tensor:
        m = self.model
        dtype = m.dtype
        x = m.model.embed_tokens(input_ids)
        cos = m.rope_cos[positions].to(dtype).unsqueeze(2)  # [B, T, 1, head_dim]
        sin = m.rope_sin[positions].to(dtype).unsqueeze(2)
        seq = kv[0].shape[-2]
        # (1) int32: the compiler refuses the int64 compare.
        key_pos = torch.arange(seq, dtype=torch.int32, device=positions.device)
        mask = key_pos[None, None, :] <= positions.to(torch.int32)[:, :, None]  # [B, T, S]
        for i, layer in enumerate(m.model.layers):
            h = layer.input_layernorm(x)
            x = x + self._attention(layer.self_attn, h, cos, sin, kv[2 * i], kv[2 * i + 1], slot_blocks, positions,
                                    attn_blocks, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = m.model.norm(x[torch.arange(x.shape[0], device=x.device), logits_index])  # [B, hidden]
        return m.lm_head(x)

    def _attention(self, attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, slot_blocks: torch.Tensor, positions: torch.Tensor,
                   attn_blocks: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h, kvh, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        group = h // kvh
        q = attn.q_proj(x).view(b, t, h, d)
        k = attn.k_proj(x).view(b, t, kvh, d)
        v = attn.v_proj(x).view(b, t, kvh, d)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # (2) one flat index_copy_ per cache: row ((block * kv_heads + head) * max_seq_len + position) of
        # cache.view(-1, head_dim). Write first, then read the whole block: new tokens attend to themselves.
        seq = k_cache.shape[-2]
        heads = torch.arange(kvh, device=x.device)
        rows = ((slot_blocks[:, :, None] * kvh + heads[None, None, :]) * seq + positions[:, :, None]).reshape(-1)
        k_cache.view(-1, d).index_copy_(0, rows, k.reshape(-1, d))
        v_cache.view(-1, d).index_copy_(0, rows, v.reshape(-1, d))
        # (4) plain attention over each row's whole block, queries grouped by their KV head.
        keys = k_cache[attn_blocks].to(torch.float32)  # [B, KVH, S, D]
        values = v_cache[attn_blocks].to(torch.float32)
        qg = q.view(b, t, kvh, group, d).permute(0, 2, 3, 1, 4).to(torch.float32)  # [B, KVH, G, T, D]
        s = torch.matmul(qg, keys[:, :, None].transpose(-1, -2)) * self.scale  # [B, KVH, G, T, S]
        s = torch.where(mask[:, None, None], s, float("-inf"))
        p = torch.softmax(s, dim=-1)
        out = torch.matmul(p, values[:, :, None])  # [B, KVH, G, T, D]
        out = out.permute(0, 3, 1, 2, 4).reshape(b, t, h * d).to(x.dtype)
        return attn.o_proj(out)


def forward_example(model: LlamaForCausalLM, kv_blocks: int, chunk: int) -> tuple[torch.Tensor, ...]:
    """Example inputs of the prefill graph ``[1, chunk]`` (the shapes and dtypes it is compiled for)."""
    long = dict(dtype=torch.long)
    kv_shape = model.kv_shape(kv_blocks)[1:]
    caches = [torch.zeros(kv_shape, dtype=model.dtype) for _ in range(2 * model.cfg.num_layers)]
    return (torch.zeros(1, chunk, **long), torch.zeros(1, chunk, **long), torch.zeros(1, chunk, **long),
            torch.zeros(1, **long), torch.zeros(1, **long), *caches)
