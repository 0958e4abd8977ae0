"""The eager path (packed weights, views of the cache) computes what the static-shape graph computes.

The cpu backend runs the eager path and the atom backend the static one, so the two must agree: same logits and
same KV written, for both weight layouts and both ways of attending over the cache.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from atom_engine.backends.cpu_attention import BlockSpan, CpuAttention
from atom_engine.backends.graphs import ForwardGraph
from atom_engine.kv_blocks import SCRATCH_BLOCK
from atom_engine.model import packed
from atom_engine.model.llama import LlamaForCausalLM
from atom_engine.model.loader import TINY_CONFIG
from atom_engine.model.packed import onednn_packs

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
    if not eager:
        return ForwardGraph(m)(ids, pos, slots, blocks, torch.tensor([n - 1]), k, v)
    return m(ids, pos, slots, torch.tensor([n - 1]), k, v, attention(m, k, v).padded([(block, n)], pos))


def attention(m: LlamaForCausalLM, k: torch.Tensor, v: torch.Tensor) -> CpuAttention:
    """The cpu backend's eager strategies over these caches."""
    return CpuAttention(k, v, m.cfg.num_heads // m.cfg.num_kv_heads)


LAYOUTS = ["onednn", "dense"]
# Lanes of one decode step (block per lane; SCRATCH_BLOCK: empty). Rows in blocks 1, 2, 4 lie close together and
# attend in one call (BlockSpan); rows in blocks 1 and 5 are too far apart and attend row by row (RowViews).
DECODES = {"one-call": [1, 2, SCRATCH_BLOCK, 4], "row-by-row": [1, SCRATCH_BLOCK, SCRATCH_BLOCK, 5]}


@pytest.mark.parametrize("lane_blocks", DECODES.values(), ids=DECODES.keys())
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": False, "qkv_bias": True, "mlp_bias": True,
                                            "o_bias": True}], ids=["tied", "untied-biases"])
@torch.inference_mode()
def test_eager_path_equals_static_graph(overrides: dict, layout: str, lane_blocks: list[int]) -> None:
    if layout == "onednn" and not onednn_packs(torch.float32):
        pytest.skip("this torch has no oneDNN")
    static, eager = model(**overrides), model(**overrides)
    eager.pack(onednn=layout == "onednn")
    head = eager.head
    eager.pack()  # idempotent: nothing is packed twice
    assert eager.head is head and head is not None and head.onednn == (layout == "onednn")
    # The packed linears let go of their dense weights; the embedding and norms keep theirs.
    released = {name for name, p in eager.named_parameters(remove_duplicate=False) if p.is_meta}
    assert released == {name for name, _ in static.named_parameters(remove_duplicate=False)
                        if "_proj." in name or (name.startswith("lm_head.") and not eager.cfg.tie_word_embeddings)}

    ks, vs = caches(static)
    ke, ve = caches(eager)
    g = torch.Generator().manual_seed(3)
    lengths = {1: 7, 2: 30, 4: 1, 5: 12}  # block -> prompt length
    for block, n in lengths.items():
        tokens = torch.randint(0, TINY_CONFIG.vocab_size, (n,), generator=g).tolist()
        a = prefill(static, ks, vs, block, tokens, eager=False)
        b = prefill(eager, ke, ve, block, tokens, eager=True)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)

    # One decode step over four lanes, some of them empty, as the cpu backend calls it.
    ids = torch.randint(0, TINY_CONFIG.vocab_size, (4, 1), generator=g)
    pos = torch.tensor([[lengths.get(b, 0)] for b in lane_blocks])
    blocks = torch.tensor(lane_blocks)
    a = ForwardGraph(static)(ids, pos, blocks[:, None], blocks, torch.zeros(4, dtype=torch.long), ks, vs)
    live = [i for i, b in enumerate(lane_blocks) if b != SCRATCH_BLOCK]
    idx = torch.tensor(live)
    rows = [(lane_blocks[i], int(pos[i]) + 1) for i in live]
    assert BlockSpan.fits(rows) == (lane_blocks is DECODES["one-call"])
    b = eager(ids[idx], pos[idx], blocks[idx, None], torch.zeros(len(live), dtype=torch.long), ke, ve,
              attention(eager, ke, ve).padded(rows, pos[idx]))
    torch.testing.assert_close(b, a[idx], rtol=1e-5, atol=1e-5)
    for block, n in lengths.items():  # the KV each path wrote, up to the decoded token
        torch.testing.assert_close(ke[:, block, :, : n + 1], ks[:, block, :, : n + 1], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_packing_falls_back_to_the_dense_layout_where_onednn_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    if not onednn_packs(torch.float32):
        pytest.skip("this torch has no oneDNN")

    def refuse(*args: object) -> None:
        raise RuntimeError("no kernel for this CPU")  # what a oneDNN build without a kernel for the CPU raises

    reference, m = model(), model()
    monkeypatch.setattr(packed, "ONEDNN_MIN_WEIGHT", 0)  # the tiny model's weights would take oneDNN
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    m.pack()
    assert m.head is not None and not m.head.onednn
    ks, vs = caches(m)
    tokens = list(range(1, 12))
    torch.testing.assert_close(prefill(m, ks, vs, 1, tokens, eager=True),
                               prefill(reference, *caches(reference), 1, tokens, eager=False), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="no kernel"):  # asked for oneDNN explicitly: no silent fallback
        model().pack(onednn=True)


@pytest.mark.parametrize("min_weight", [0, packed.ONEDNN_MIN_WEIGHT])
def test_pack_takes_onednn_only_for_weights_large_enough(monkeypatch: pytest.MonkeyPatch, min_weight: int) -> None:
    if not onednn_packs(torch.float32):
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setattr(packed, "ONEDNN_MIN_WEIGHT", min_weight)
    m = model()  # the tiny model: its largest weight (the head) is below the default bound
    m.pack()
    layouts = {p.onednn for layer in m.model.layers for p in (layer.self_attn.qkv, layer.self_attn.o,
                                                             layer.mlp.gate_up, layer.mlp.down)} | {m.head.onednn}
    assert layouts == {min_weight == 0}
    wide = model(hidden_size=256, intermediate_size=512, num_heads=4, head_dim=64)  # every weight >= 256 x 256
    wide.pack()
    assert wide.head.onednn and wide.model.layers[0].self_attn.o.onednn


# A speculative step: each lane's last token and a draft of its own length (0..3), padded to the longest.
VERIFIES = {"one-call": ([1, 2, SCRATCH_BLOCK, 4], [2, 0, 0, 3]),
            "row-by-row": ([1, SCRATCH_BLOCK, 5, SCRATCH_BLOCK], [1, 0, 3, 0])}


@pytest.mark.parametrize("lanes", VERIFIES.values(), ids=VERIFIES.keys())
@torch.inference_mode()
def test_speculative_step_equals_static_graph(lanes: tuple[list[int], list[int]]) -> None:
    from atom_engine.backends.cpu import CpuBackend

    lane_blocks, drafts = lanes
    static = model()
    backend = CpuBackend(model(), kv_blocks=BLOCKS)  # packs; verifies flat (Ragged)
    ks, vs = caches(static)
    g = torch.Generator().manual_seed(5)
    lengths = {1: 9, 2: 20, 4: 3, 5: 14}
    for block, n in lengths.items():
        tokens = torch.randint(0, TINY_CONFIG.vocab_size, (n,), generator=g).tolist()
        prefill(static, ks, vs, block, tokens, eager=False)
        backend.prefill(torch.tensor([tokens]), torch.arange(n)[None], torch.full((1, n), block),
                        torch.tensor([block]), torch.tensor([n - 1]))
    t = 1 + max(drafts)
    ids = torch.randint(0, TINY_CONFIG.vocab_size, (4, t), generator=g)
    pos = torch.zeros(4, t, dtype=torch.long)
    slots = torch.full((4, t), SCRATCH_BLOCK)
    for i, (b, d) in enumerate(zip(lane_blocks, drafts, strict=True)):
        if b == SCRATCH_BLOCK:
            continue
        start = lengths[b] - 1  # the lane's last token sits at its last position, then its draft
        pos[i] = torch.tensor([start + min(j, d) for j in range(t)])
        slots[i, : 1 + d] = b
    blocks = torch.tensor(lane_blocks)
    rows = [(b, int(pos[i].max()) + 1) for i, b in enumerate(lane_blocks) if b != SCRATCH_BLOCK]
    assert BlockSpan.fits(rows, t) == (lanes is VERIFIES["one-call"])
    want = ForwardGraph(static)(ids, pos, slots, blocks, torch.arange(t).expand(4, t), ks, vs)
    got = backend.verify(ids, pos, slots, blocks)  # the real tokens' logits, lane by lane: pads never computed
    assert got.shape[0] == sum(1 + d for b, d in zip(lane_blocks, drafts, strict=True) if b != SCRATCH_BLOCK)
    row = 0
    for i, (b, d) in enumerate(zip(lane_blocks, drafts, strict=True)):
        if b == SCRATCH_BLOCK:
            continue
        torch.testing.assert_close(got[row : row + 1 + d], want[i, : 1 + d], rtol=1e-5, atol=1e-5)
        row += 1 + d
        end = lengths[b] + d
        torch.testing.assert_close(backend.k_cache[:, b, :, :end], ks[:, b, :, :end], rtol=1e-5, atol=1e-5)
