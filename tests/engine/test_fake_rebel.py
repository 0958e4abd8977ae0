"""The fake RBLN SDK keeps the rules of Rebellions' call sites, so it refuses what the atom backend used to do:
KV passed as call arguments, a context per graph, KV read from the host tensors given at compile."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from atom_engine.backends.atom import AtomBackend
from atom_engine.backends.graphs import CopyBlockGraph, ExportKVGraph, ForwardGraph
from atom_engine.engine import LLMEngine
from atom_engine.model.loader import load_model
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings

SETTINGS = dict(lanes=2, kv_blocks=4, max_seq_len=128, prefill_chunk=64, prefix_cache=False)
PROMPTS = ["the quick brown fox", "jumps over", "the lazy dog"]


def forward_info(b: int, t: int, kv: list[int], static: bool = True) -> list[tuple[str, list[int], str]]:
    return [("input_ids", [b, t], "int64"), ("positions", [b, t], "int64"), ("slot_blocks", [b, t], "int64"),
            ("attn_blocks", [b], "int64"), ("logits_index", [b], "int64"),
            ("k_cache", kv, "float32"), ("v_cache", kv, "float32")]


def prefill_args(tokens: list[int], block: int) -> list[torch.Tensor]:
    ids = torch.zeros(1, 64, dtype=torch.long)
    ids[0, : len(tokens)] = torch.tensor(tokens)
    positions = torch.zeros(1, 64, dtype=torch.long)
    positions[0, : len(tokens)] = torch.arange(len(tokens))
    slots = torch.zeros(1, 64, dtype=torch.long)
    slots[0, : len(tokens)] = block
    return [ids, positions, slots, torch.tensor([block]), torch.tensor([len(tokens) - 1])]


@pytest.fixture
def tiny():  # noqa: ANN201
    return load_model("builtin:tiny", max_seq_len=128)[0]


def compile_old_way(rebel, module: torch.nn.Module, info: list, k: torch.Tensor, v: torch.Tensor):  # noqa: ANN001, ANN201
    """What the atom backend did before: host KV tensors marked static, one context per graph."""
    ctx = rebel.CompileContext(use_weight_sharing=True)
    ctx.mark_static_address(k, "k_cache")
    ctx.mark_static_address(v, "v_cache")
    examples = [k if n == "k_cache" else v if n == "v_cache" else torch.zeros(s, dtype=torch.long) for n, s, _ in info]
    return rebel.Runtime(rebel.compile_from_torch(module, input_info=info, example_inputs=examples,
                                                  compile_context=ctx), tensor_type="pt", device=0)


def test_the_old_call_with_kv_arguments_is_refused(rebel, tiny) -> None:  # noqa: ANN001
    k, v = torch.zeros(tiny.kv_shape(4)), torch.zeros(tiny.kv_shape(4))
    rt = compile_old_way(rebel, ForwardGraph(tiny), forward_info(1, 64, list(k.shape)), k, v)
    args = prefill_args([1, 2, 3], 1)
    with pytest.raises(rebel.RBLNRuntimeError, match=r"the runtime takes 5 inputs .*; got 7"):
        rt(*args, k, v)
    rt(*args)  # non-static inputs only
    assert k.abs().sum() == 0 and v.abs().sum() == 0  # the host tensors given at compile never change


def test_one_context_per_graph_loses_the_prefill_kv(rebel, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    def one_context_per_graph(self: AtomBackend, num_devices: int) -> dict:
        compiled = {}
        for name, (module, info) in self.graphs.items():
            ctx = rebel.CompileContext(use_weight_sharing=True)
            examples = []
            for n, shape, dt in info:
                t = torch.empty(shape, dtype=getattr(torch, dt), device="meta" if n.startswith("past") else "cpu")
                if n.startswith("past"):
                    ctx.mark_static_address(t, n)
                examples.append(t)
            compiled[name] = rebel.compile_from_torch(module, input_info=info, example_inputs=examples,
                                                      compile_context=ctx, num_devices=num_devices)
        return compiled

    params = SamplingParams(max_tokens=8, ignore_eos=True)
    cpu = [o.token_ids for o in LLMEngine(EngineSettings(backend="cpu", **SETTINGS)).generate(PROMPTS, params)]
    shared = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    assert [o.token_ids for o in shared.generate(PROMPTS, params)] == cpu
    monkeypatch.setattr(AtomBackend, "_compile", one_context_per_graph)
    split = LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    assert [o.token_ids for o in split.generate(PROMPTS, params)] != cpu  # decode never sees prefill's KV


def test_compile_keywords_are_the_sdks(rebel, tiny) -> None:  # noqa: ANN001
    assert "num_devices" in inspect.signature(rebel.compile).parameters  # what optimum probes for
    info = [("src", [1], "int64"), ("dst", [1], "int64")]
    with pytest.raises(TypeError, match="unexpected keyword argument 'tensor_parallel_size'"):
        rebel.compile_from_torch(CopyBlockGraph(), input_info=info, tensor_parallel_size=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'static_inputs'"):
        rebel.compile_from_torch(CopyBlockGraph(), input_info=info, static_inputs=[])
    with pytest.raises(ValueError, match="`prefill_chunk_size` must be a positive integer divisible by 64"):
        rebel.compile_from_torch(ForwardGraph(tiny), input_info=forward_info(1, 48, list(tiny.kv_shape(2))))
    meta = torch.empty(tiny.kv_shape(2), device="meta")
    ctx = rebel.CompileContext(use_weight_sharing=True)
    ctx.mark_static_address(meta, "k_cache")
    info = forward_info(1, 64, list(tiny.kv_shape(2)))
    examples = [torch.zeros(s, dtype=torch.long) for _, s, _ in info[:5]] + [torch.zeros(tiny.kv_shape(2))] * 2
    with pytest.raises(ValueError, match="'k_cache' is a static address: pass the tensor marked in the context"):
        rebel.compile_from_torch(ForwardGraph(tiny), input_info=info, example_inputs=examples, compile_context=ctx)
    with pytest.raises(TypeError):
        rebel.CompileContext(weight_sharing=True)


def _static_graph(rebel, tiny, num_devices: int = 1, kv_blocks: int = 2, ctx=None):  # noqa: ANN001, ANN202
    ctx = ctx or rebel.CompileContext(use_weight_sharing=True)
    info = forward_info(1, 64, list(tiny.kv_shape(kv_blocks)))
    metas = {}
    for n, s, _ in info[5:]:
        metas[n] = ctx.static.get(n, torch.empty(s, device="meta"))
        ctx.mark_static_address(metas[n], n)
    examples = [torch.zeros(s, dtype=torch.long) for _, s, _ in info[:5]] + list(metas.values())
    return rebel.compile_from_torch(ForwardGraph(tiny), input_info=info, example_inputs=examples,
                                    compile_context=ctx, num_devices=num_devices), ctx


def test_runtime_devices_follow_optimums_checks(rebel, tiny, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    one, _ = _static_graph(rebel, tiny)
    two, _ = _static_graph(rebel, tiny, num_devices=2)
    with pytest.raises(rebel.RBLNRuntimeError, match=r"The number of devices \(2\) does not match `num_devices` \(1\)"):
        rebel.Runtime(one, tensor_type="pt", device=[0, 1])
    with pytest.raises(rebel.RBLNRuntimeError, match="Device 1 is not a valid NPU device. Please check your NPU"):
        rebel.Runtime(one, tensor_type="pt", device=1)
    with pytest.raises(rebel.RBLNRuntimeError, match=r"Device must be a\(n\) \(list of\) integer\(s\)"):
        rebel.Runtime(one, tensor_type="pt", device=["0"])
    with pytest.raises(rebel.RBLNRuntimeError, match=r"The number of devices \(1\) does not match `num_devices` \(2\)"):
        rebel.Runtime(two, tensor_type="pt", device=0)
    with pytest.raises(TypeError):
        rebel.Runtime(one, tensor_type="pt", device=0, devices=[0])  # unknown keyword
    rebel.Runtime(one, tensor_type="pt", device=0, activate_profiler=False, timeout=60)
    monkeypatch.setenv("REBEL_FAKE_NPUS", "2")
    assert rebel.Runtime(two, tensor_type="pt", device=[0, 1]).devices == (0, 1)
    assert rebel.Runtime(two, tensor_type="pt").devices == (0, 1)  # None: 0..num_devices-1


def test_device_memory_is_16_gib_per_atom_and_weights_are_held_once_per_context(
        rebel, tiny, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    big, _ = _static_graph(rebel, tiny, kv_blocks=8 * 32768)  # K and V: 8 GiB each, as meta tensors
    assert 2 * 4 * torch.Size(tiny.kv_shape(8 * 32768)).numel() > rebel.AVAILABLE_BYTES
    with pytest.raises(rebel.RBLNRuntimeError, match="Lack of device memory"):
        rebel.Runtime(big, tensor_type="pt", device=0)  # refused before anything is allocated
    assert rebel.device_bytes_in_use(0) == 0

    a, ctx = _static_graph(rebel, tiny)
    b, _ = _static_graph(rebel, tiny, ctx=ctx)
    ra = rebel.Runtime(a, tensor_type="pt", device=0)
    one = rebel.device_bytes_in_use(0)
    rb = rebel.Runtime(b, tensor_type="pt", device=0)
    assert rebel.device_bytes_in_use(0) == one  # same context: weights and KV held once
    c, _ = _static_graph(rebel, tiny)  # another context: its own weights and KV
    rc = rebel.Runtime(c, tensor_type="pt", device=0)
    assert rebel.device_bytes_in_use(0) == 2 * one
    del ra, rb, rc
    assert rebel.device_bytes_in_use(0) == 0  # released with the runtimes

    # The same rule on a budget scaled down to this model: one device lacks memory, two share the load.
    monkeypatch.setattr(rebel, "AVAILABLE_BYTES", one * 3 // 4)
    with pytest.raises(rebel.RBLNRuntimeError, match="Lack of device memory"):
        rebel.Runtime(_static_graph(rebel, tiny)[0], tensor_type="pt", device=0)
    monkeypatch.setenv("REBEL_FAKE_NPUS", "2")
    rt = rebel.Runtime(_static_graph(rebel, tiny, num_devices=2)[0], tensor_type="pt", device=[0, 1])
    assert rebel.device_bytes_in_use(0) == rebel.device_bytes_in_use(1) == -(-one // 2)
    del rt


def test_static_buffers_are_shared_by_the_runtimes_of_one_context(rebel, tiny) -> None:  # noqa: ANN001
    fwd, ctx = _static_graph(rebel, tiny)
    info = [("block", [1], "int64"), ("positions", [64], "int64"),
            *forward_info(1, 64, list(tiny.kv_shape(2)))[5:]]
    metas = [ctx.static["k_cache"], ctx.static["v_cache"]]
    export = rebel.compile_from_torch(ExportKVGraph(), input_info=info, compile_context=ctx,
                                      example_inputs=[torch.zeros(1, dtype=torch.long),
                                                      torch.zeros(64, dtype=torch.long), *metas])
    run, read = rebel.Runtime(fwd, tensor_type="pt", device=0), rebel.Runtime(export, tensor_type="pt", device=0)
    run(*prefill_args([5, 6, 7], 1))
    kv = read(torch.tensor([1]), torch.arange(64))
    assert kv[:, :, :, :3].abs().sum() > 0 and kv[:, :, :, 3:].abs().sum() == 0
    assert metas[0].device.type == "meta"  # the example tensors stay descriptions


def test_save_and_load_round_trip(rebel, tiny, tmp_path: Path) -> None:  # noqa: ANN001
    compiled, _ = _static_graph(rebel, tiny)
    compiled.save(tmp_path / "prefill.rbln")
    loaded = rebel.RBLNCompiledModel(tmp_path / "prefill.rbln")
    assert loaded.input_info == compiled.input_info and rebel.LOADED == [loaded]
    args = prefill_args([9, 8, 7, 6], 1)
    want = rebel.Runtime(compiled, tensor_type="pt", device=0)(*args)
    got = rebel.Runtime(loaded, tensor_type="pt", device=0)(*args)
    assert torch.equal(got, want)
    (tmp_path / "junk.rbln").write_bytes(b"not a graph")
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever torch.load says about a foreign file
        rebel.RBLNCompiledModel(tmp_path / "junk.rbln")


def test_the_backend_names_the_device_count_as_the_installed_compiler_does(
        rebel, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Compilers that predate ``num_devices`` take ``tensor_parallel_size`` (optimum/rbln/utils/runtime_utils.py:
    25-37): the backend probes ``rebel.compile``'s signature as optimum does."""
    seen: list[int] = []
    current = rebel.compile

    def older_compile(module, input_info, *, npu=None, tensor_parallel_size=None, example_inputs=None,  # noqa: ANN001, ANN202
                      compile_context=None):
        seen.append(tensor_parallel_size)
        return current(module, input_info, npu=npu, num_devices=tensor_parallel_size, example_inputs=example_inputs,
                       compile_context=compile_context)

    monkeypatch.setattr(rebel, "compile", older_compile)
    LLMEngine(EngineSettings(backend="atom", **SETTINGS))
    assert seen == [1] * 6
