"""The eager path (packed weights, per-row views of the cache) computes what the static-shape graph computes.

The cpu backend runs the eager path and the atom backend the static one, so the two must agree: same logits, same
KV written, and packing must leave the weights (as the state dict reads them) untouched.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from atom_engine.kv_blocks import SCRATCH_BLOCK
from atom_engine.model.llama import LlamaForCausalLM
from atom_engine.model.loader import TINY_CONFIG

MAX_SEQ, BLOCKS = 48, 6


def model(**overrides: object) -> LlamaForCausalLM:
    torch.manual_seed(0)
    m = LlamaForCausalLM(dataclasses.replace(TINY_CONFIG, **overrides), MAX_SEQ).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m


def caches(m: LlamaForCausalLM) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(m.kv_shape(BLOCKS)), torch.zeros(m.kv_shape(BLOCKS))


def prefill(m: LlamaForCausalLM, k: torch.Tensor, v: torch.Tensor, block: int, tokens: list[int], eager: bool):
    n = len(tokens)
    ids, pos = torch.tensor([tokens]), torch.arange(n)[None]
    slots, blocks = torch.full((1, n), block), torch.tensor([block])
    return m(ids, pos, slots, blocks, torch.tensor([n - 1]), k, v, [(block, n)] if eager else None)


@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": False, "qkv_bias": True, "mlp_bias": True,
                                            "o_bias": True}], ids=["tied", "untied-biases"])
@torch.inference_mode()
def test_eager_path_equals_static_graph(overrides: dict) -> None:
    static, eager = model(**overrides), model(**overrides)
    before = {name: t.clone() for name, t in eager.state_dict().items()}
    eager.pack()
    ptrs = [p.data_ptr() for p in eager.parameters()]
    eager.pack()  # idempotent: nothing is packed twice
    assert [p.data_ptr() for p in eager.parameters()] == ptrs
    after = eager.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

    ks, vs = caches(static)
    ke, ve = caches(eager)
    g = torch.Generator().manual_seed(3)
    lengths = {1: 7, 2: 30, 4: 1}  # block -> prompt length; lane 3 stays empty (scratch)
    for block, n in lengths.items():
        tokens = torch.randint(0, TINY_CONFIG.vocab_size, (n,), generator=g).tolist()
        a = prefill(static, ks, vs, block, tokens, eager=False)
        b = prefill(eager, ke, ve, block, tokens, eager=True)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)

    # One decode step over four lanes, one of them empty, as the cpu backend calls it.
    lane_blocks = [1, 2, SCRATCH_BLOCK, 4]
    ids = torch.randint(0, TINY_CONFIG.vocab_size, (4, 1), generator=g)
    pos = torch.tensor([[lengths.get(b, 0)] for b in lane_blocks])
    blocks = torch.tensor(lane_blocks)
    a = static(ids, pos, blocks[:, None], blocks, torch.zeros(4, dtype=torch.long), ks, vs)
    live = [i for i, b in enumerate(lane_blocks) if b != SCRATCH_BLOCK]
    idx = torch.tensor(live)
    b = eager(ids[idx], pos[idx], blocks[idx, None], blocks[idx], torch.zeros(len(live), dtype=torch.long), ke, ve,
              [(lane_blocks[i], int(pos[i]) + 1) for i in live])
    torch.testing.assert_close(b, a[idx], rtol=1e-5, atol=1e-5)
    for block, n in lengths.items():  # the KV each path wrote, up to the decoded token
        torch.testing.assert_close(ke[:, block, :, : n + 1], ks[:, block, :, : n + 1], rtol=1e-5, atol=1e-5)
