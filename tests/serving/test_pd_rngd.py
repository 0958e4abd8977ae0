"""Heterogeneous PD: an rngd prefill worker (FuriosaAI RNGD through furiosa-torch, compiled for real, on the fake
device runtime) feeding a cpu decoder and an atom decoder (on the fake RBLN SDK), through the real HTTP transfer.

The worker runs in .venv-rngd (torch 2.10, what furiosa-torch pins) and the decoders in this venv (torch 2.15), as
the engine-rngd and engine images would: the wire format is all they share. Token-exact against a cpu-only engine,
in float32 and bfloat16; a worker of another dtype than the decoder's is refused with both dtypes named.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings

from tests.serving import conftest as sv
from tests.serving.conftest import Proc
from tests.serving.test_pd import complete_all, decode_settings

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.rngd]

RNGD_VENV = sv.REPO / ".venv-rngd"
RNGD_BIN = RNGD_VENV / "bin" / "atom-engine"
FAKES = str(sv.REPO / "tests" / "fakes")
ARTIFACTS = os.environ.get("ATOM_RNGD_ARTIFACTS", str(Path.home() / ".cache" / "atom" / "rngd-artifacts"))
COLD_START_TIMEOUT = 1800.0  # a cold artifact cache compiles the prefill graph first (minutes on two cores)
# Prompts and outputs fit the worker's maxSeqLen 64 (the byte tokenizer: one token per character).
PROMPTS = ["short", "The quick brown fox", "a prompt longer than one chunk of sixteen", "x" * 40]
MAX_TOKENS = 10
# The rngd tests' cached artifact (tests/rngd/conftest.py: its shapes and its one-PE fusion).
SHAPES = dict(max_seq_len=64, prefill_chunk=16, rngd_pes=1)


@pytest.fixture(scope="module")
def rngd_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    """One rngd prefill worker per dtype, started lazily, killed after the module."""
    if not (RNGD_VENV / "bin" / "atom-engine").is_file():
        pytest.fail("the rngd prefill worker runs from .venv-rngd: run `make venv-rngd` (make test does)")
    tmp = tmp_path_factory.mktemp("rngd-prefill")
    procs: dict[str, Proc] = {}

    def start(dtype: str) -> Proc:
        if dtype not in procs:
            settings = {**sv.BASE, **SHAPES, "backend": "rngd", "lanes": 1, "kv_blocks": 2, "prefix_cache": False,
                        "dtype": dtype, "compile_cache_dir": ARTIFACTS}
            env = {"ATOM_RNGD_RUNTIME": "furiosa_fake",
                   "PYTHONPATH": os.pathsep.join(p for p in (FAKES, os.environ.get("PYTHONPATH", "")) if p)}
            proc = sv.spawn(tmp, f"rngd-{dtype}", "prefill", settings, env, engine_bin=RNGD_BIN)
            procs[dtype] = proc
            sv.wait_ready_sync(proc, timeout=COLD_START_TIMEOUT)
        return procs[dtype]

    try:
        yield start  # type: ignore[misc]
    finally:
        for p in procs.values():
            p.kill()


def cpu_only(prompts: list[str], dtype: str) -> list[list[int]]:
    engine = LLMEngine(EngineSettings(**{**sv.BASE, "lanes": 1, "kv_blocks": 2, "prefix_cache": False,
                                         "dtype": dtype}))
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.token_ids for o in engine.generate(prompts, params)]


@pytest.fixture
def fake_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(FAKES)  # the atom decoder imports the fake rebel


@pytest.mark.timeout(3600)  # a cold artifact cache compiles first (minutes on two shared cores)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("decoder", ["cpu", "atom"])
async def test_rngd_prefill_feeds_cpu_and_atom_decode_token_exact(rngd_workers, decoder: str, dtype: str,
                                                                  fake_sdk: None) -> None:  # noqa: ANN001
    worker = rngd_workers(dtype)
    extra = dict(backend="atom", prefill_chunk=64) if decoder == "atom" else {}
    before = await sv.scrape(worker.url)
    async with sv.in_process("decode", **decode_settings([worker], False, dtype=dtype, **extra)) as (server, url):
        assert await complete_all(url, PROMPTS, MAX_TOKENS) == cpu_only(PROMPTS, dtype)
        m = await sv.wait_metrics(url, sv.idle, "idle")
        sv.assert_no_block_leaked(m)
        assert m["atom:prefill_tokens_computed_total"] == 0  # remote-only: every prompt's KV came from RNGD
        assert server.engine.settings.backend == decoder
    after = await sv.scrape(worker.url)
    assert after["atom:prefill_requests_total"] - before["atom:prefill_requests_total"] == len(PROMPTS)


@pytest.mark.timeout(3600)  # a cold artifact cache compiles first (minutes on two shared cores)
async def test_a_shipment_of_another_dtype_is_refused_by_the_atom_decoder(rngd_workers,  # noqa: ANN001
                                                                         fake_sdk: None) -> None:
    worker = rngd_workers("float32")
    settings = decode_settings([worker], False, dtype="bfloat16", backend="atom", prefill_chunk=64, pd_attempts=1)
    async with sv.in_process("decode", **settings) as (_server, url):
        with pytest.raises(openai.APIStatusError) as info:
            await sv.client(url).completions.create(model=sv.MODEL, prompt="short", max_tokens=4)
        assert info.value.status_code == 503
        assert "KV frame dtype is 'float32' but this decode engine runs 'bfloat16'" in info.value.body["message"]
        m = await sv.wait_metrics(url, sv.idle, "idle")
        sv.assert_no_block_leaked(m)
        assert m["vllm:generation_tokens_total"] == 0
