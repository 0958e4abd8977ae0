"""The rngd prefill graph (the compiler's form, one K and V tensor per layer) against the shared static-shape graph
(one 5-D K and V cache): the same logits up to rounding, the same greedy token, and the same KV written, including
a chunk that attends to KV written by an earlier chunk and pad tokens sent to the scratch block."""

from __future__ import annotations

import pytest
import torch
from atom_engine.backends.graphs import ForwardGraph
from atom_engine.backends.rngd_graphs import RngdForwardGraph, forward_example
from atom_engine.kv_blocks import SCRATCH_BLOCK
from atom_engine.model.loader import load_model

CHUNK, BLOCKS, SEQ = 16, 3, 64
# Relative to the tensor's largest magnitude: bfloat16 keeps 8 bits of mantissa, so two orders of summation differ
# by a few units of the last place of the largest values.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def assert_near(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    scale = want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), atol=TOLERANCE[dtype] * scale, rtol=0)


def chunk_inputs(tokens: list[int], start: int, block: int) -> tuple[torch.Tensor, ...]:
    n = len(tokens)
    ids = torch.zeros(1, CHUNK, dtype=torch.long)
    ids[0, :n] = torch.tensor(tokens)
    positions = torch.zeros(1, CHUNK, dtype=torch.long)
    positions[0, :n] = torch.arange(start, start + n)
    slots = torch.full((1, CHUNK), SCRATCH_BLOCK, dtype=torch.long)
    slots[0, :n] = block
    return ids, positions, slots, torch.tensor([block]), torch.tensor([n - 1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rngd_form_gives_the_shared_forms_logits_and_kv(dtype: str) -> None:
    model, _ = load_model("builtin:tiny", max_seq_len=SEQ, dtype=dtype)
    shared, rngd = ForwardGraph(model).eval(), RngdForwardGraph(model).eval()
    k5 = torch.zeros(model.kv_shape(BLOCKS), dtype=model.dtype)
    v5 = torch.zeros_like(k5)
    per_layer = list(forward_example(model, BLOCKS, CHUNK)[5:])
    assert len(per_layer) == 2 * model.cfg.num_layers and per_layer[0].shape == k5.shape[1:]
    prompt = list(range(40, 40 + 27))  # two chunks: the second attends to the first one's KV
    block = 1
    with torch.no_grad():
        for start in range(0, len(prompt), CHUNK):
            piece = prompt[start : start + CHUNK]
            inputs = chunk_inputs(piece, start, block)
            want = shared(*inputs, k5, v5)
            got = rngd(*inputs, *per_layer)
            assert_near(got, want, model.dtype)
            assert torch.equal(got.argmax(-1), want.argmax(-1))
    for layer in range(model.cfg.num_layers):
        for cache5, mine in ((k5, per_layer[2 * layer]), (v5, per_layer[2 * layer + 1])):
            assert_near(mine[block, :, : len(prompt)], cache5[layer, block, :, : len(prompt)], model.dtype)
            assert not mine[block, :, len(prompt) :].any()  # nothing written past the prompt
            assert not mine[2].any()  # nor into another block
    assert per_layer[0][SCRATCH_BLOCK].any()  # the second chunk's pad tokens went to the scratch block
