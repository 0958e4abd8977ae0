"""PD disaggregation with the atom backend (on the fake RBLN SDK): the KV an ATOM prefill worker ships is what its
device computed, read through the export graph, and an ATOM decoder imports shipped KV through its import graph.
All three pairings give the cpu standalone engine's tokens, with prefix hits (a shipment that starts mid-block)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving import conftest as sv
from tests.serving.conftest import Proc
from tests.serving.test_pd import MAX_TOKENS, PROMPTS, complete_all, decode_settings

FAKES = str(sv.REPO / "tests" / "fakes")
ATOM = dict(backend="atom", prefill_chunk=64)


@pytest.fixture(scope="module")
def atom_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("atom-prefill")
    path = os.pathsep.join(p for p in (FAKES, os.environ.get("PYTHONPATH", "")) if p)
    settings = {**sv.BASE, **ATOM, "lanes": 1, "kv_blocks": 3, "prefix_cache": False}
    proc = sv.spawn(tmp, "atom-prefill", "prefill", settings, {"PYTHONPATH": path})
    try:
        sv.wait_ready_sync(proc)
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def fake_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process decoder imports the fake SDK too."""
    monkeypatch.syspath_prepend(FAKES)


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("pairing", ["atom-to-atom", "atom-to-cpu", "cpu-to-atom"])
async def test_pd_pairings_are_token_exact(pairing: str, atom_worker: Proc, prefill_pair: list[Proc],
                                           fake_sdk: None, tmp_path: Path) -> None:
    producer, consumer = pairing.split("-to-")
    workers = [atom_worker] if producer == "atom" else prefill_pair[:1]
    decoder = ATOM if consumer == "atom" else {}
    expected = sv.reference_tokens(PROMPTS, MAX_TOKENS)
    before = await sv.scrape(workers[0].url)
    async with sv.in_process("decode", **decode_settings(workers, True), **decoder) as (server, url):
        assert await complete_all(url, PROMPTS) == expected
        assert await complete_all(url, PROMPTS) == expected  # prefix hits: shipments that start mid-block
        m = await sv.wait_metrics(url, sv.idle, "idle")
        sv.assert_no_block_leaked(m)
        assert m["atom:prefill_tokens_computed_total"] == 0  # remote-only: every prompt's KV was shipped
        assert m["vllm:prefix_cache_hits_total"] > 0
        assert server.engine.settings.backend == consumer
    after = await sv.scrape(workers[0].url)
    assert after["atom:prefill_requests_total"] - before["atom:prefill_requests_total"] == 2 * len(PROMPTS)


def test_serve_compiles_once_then_loads_and_refuses_a_mismatch(tmp_path: Path) -> None:
    """``atom-engine serve`` on the atom backend with compileCacheDir: the first start compiles and saves, the
    second loads the same key, and a pinned artifact that disagrees stops the process with exit status 3."""
    cache = tmp_path / "cache"
    settings = {**sv.BASE, **ATOM, "lanes": 1, "kv_blocks": 3, "prefix_cache": False, "compile_cache_dir": str(cache)}
    env = {"PYTHONPATH": os.pathsep.join(p for p in (FAKES, os.environ.get("PYTHONPATH", "")) if p)}
    seen = []
    for name in ("first", "second"):
        proc = sv.spawn(tmp_path, name, "prefill", settings, env)
        try:
            sv.wait_ready_sync(proc)
        finally:
            proc.kill()
        seen.append(re.search(r"event=(artifact_\w+) key=(\w+) seconds=", proc.log.read_text()).groups())
    (key_dir,) = cache.iterdir()
    assert seen == [("artifact_compiled", key_dir.name), ("artifact_loaded", key_dir.name)]
    proc = sv.spawn(tmp_path, "mismatch", "prefill", {**settings, "compile_cache_dir": str(key_dir), "seed": 7}, env)
    assert proc.proc.wait(sv.START_TIMEOUT) == 3
    assert "artifact mismatch: model.hash: artifact has" in proc.log.read_text()
