"""The /metrics table reads each component's stats by attribute (atom_engine.stats): every row resolves against
the stats objects of each role (standalone, decode with a connector, prefill), each role exports the metrics it
exported when the figures were one dict of string keys (a metric shows when its field is among the role's
figures, with the value the last component reporting that field gave), and a misspelled or removed field fails
loudly: at import, at the write, or at the first scrape."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields

import pytest
from atom_engine.engine import LLMEngine
from atom_engine.kv_blocks import SourceSlots
from atom_engine.pd.client import PrefillClient
from atom_engine.pd.remote import RemoteConnector, RemotePrefill
from atom_engine.pd.selective import SelectiveConnector
from atom_engine.pd.worker import PrefillWorker
from atom_engine.sequence import SamplingParams
from atom_engine.server import metrics
from atom_engine.server.app import OpenAIServer, PrefillServer
from atom_engine.server.load import PrefillQueue
from atom_engine.server.metrics import TABLE, Row, ServerMetrics, series_labels
from atom_engine.server.prefill_service import PrefillService
from atom_engine.settings import EngineSettings
from atom_engine.stats import BatcherCounters, BatcherStats, InFlightStats
from prometheus_client.parser import text_string_to_metric_families

SETTINGS = {"max_seq_len": 64, "lanes": 2, "kv_blocks": 4}
ENGINE = {  # what a standalone engine's server exported before the table read stats by attribute
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens",
    "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens", "atom:kv_blocks_total",
    "atom:kv_blocks_free", "atom:kv_blocks_cached", "atom:kv_blocks_lanes", "atom:kv_blocks_pinned",
    "atom:cpu_threads", "atom:engine_idle", "atom:pd_source_slots_held", "atom:requests_finished",
    "atom:requests_cancelled", "atom:requests_failed", "atom:requests_rejected", "atom:prefill_tokens_computed",
    "atom:prefetch_ready", "atom:requests_in_flight", "atom:arrived_requests", "atom:arrived_prompt_tokens",
    "atom:pd_waiting_for_kv", "atom:request_decode_seconds", "atom:decoded_max_tokens",
    "atom:arrived_max_tokens", "vllm:prompt_tokens_cached", "vllm:num_preemptions",
}
REMOTE = {"atom:pd_remote_prefills", "atom:pd_remote_prefill_tokens", "atom:pd_kv_bytes_imported",
          "atom:prefetch_started", "atom:prefetch_hits", "atom:prefetch_cancelled", "atom:prefetch_failed",
          "atom:prefetch_cached_tokens"}
CLIENT = {"atom:pd_bytes_received", "atom:pd_transfer_seconds", "atom:pd_fetch_attempts", "atom:pd_fetch_retries",
          "atom:pd_fetch_failures", "atom:pd_breaker_state", "atom:pd_breaker_transitions"}
PREFILL = {"vllm:num_requests_running", "vllm:num_requests_waiting", "atom:kv_blocks_total", "atom:kv_blocks_free",
           "atom:kv_blocks_cached", "atom:kv_blocks_lanes", "atom:cpu_threads", "atom:prefill_tokens_computed",
           "atom:prefills_abandoned", "atom:prefill_requests", "atom:prefill_bytes_sent",
           "atom:prefill_sends_started", "atom:prefill_sends_failed", "atom:prefill_in_flight",
           "atom:prefill_leases_expired", "atom:requests_in_flight", "atom:prefill_tokens_waiting",
           "atom:prefill_busy_seconds"}


def scraped(m: ServerMetrics) -> dict[str, tuple[str, float]]:
    """name -> (type, value) of the model's gauges and counters (histograms and the info gauge left out)."""
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        if family.type not in ("gauge", "counter") or family.name.endswith("_created") or \
                family.name in ("vllm:cache_config_info", "vllm:request_success"):
            continue  # histograms' creation times, the info gauge, the counter by finish reason
        (sample,) = family.samples
        assert sample.labels == series_labels(family.name, m.model_name)
        out[family.name] = (family.type, sample.value)
    return out


def by_key(figures: list[object]) -> dict[str, tuple[str, float]]:
    """What the table exported when the figures were one dict: the roles' dicts merged (the last one wins), each
    row shown when its key was among them."""
    values = {k: v for f in figures for k, v in asdict(f).items()}
    out = {}
    for name, row in TABLE.items():
        (key,) = {s.__name__ for s in row.sources}  # one field name per row, whichever component has it
        if key in values:
            out[name] = (row.kind, float(values[key]))
    return out


def check(server: OpenAIServer | PrefillServer, expected: set[str]) -> dict[str, tuple[str, float]]:
    got = scraped(server.metrics)
    assert set(got) == expected
    assert got == by_key(server.stats())
    return got


def test_every_row_reads_a_field_of_a_stats_dataclass() -> None:
    assert TABLE == {**metrics.VLLM, **metrics.ATOM} and len(TABLE) == 57
    for name, row in TABLE.items():
        assert row.kind in ("gauge", "counter") and row.sources, name
        for source in row.sources:
            assert source.__objclass__.__module__ == "atom_engine.stats", name
            assert source.__name__ in {f.name for f in fields(source.__objclass__)}, name


async def test_each_role_exports_what_it_did() -> None:
    loop = asyncio.get_running_loop()
    covered: set[str] = set()

    # Standalone: before the model loads only the requests in flight; then the engine's figures.
    standalone = OpenAIServer(EngineSettings(**SETTINGS), "standalone")
    check(standalone, {"atom:requests_in_flight"})
    standalone.engine = LLMEngine(standalone.settings)
    standalone.engine.generate(["hello there", "hello there"], SamplingParams(max_tokens=3))
    got = check(standalone, ENGINE)
    assert got["vllm:generation_tokens"] == ("counter", 6.0) and got["atom:requests_finished"] == ("counter", 2.0)
    assert got["atom:pd_source_slots_held"] == ("gauge", 0.0) and got["atom:engine_idle"] == ("gauge", 1.0)
    covered |= set(got)

    # Decode, remote-only and selective: the connector's and the client's figures too.
    for selective in (False, True):
        decode = OpenAIServer(EngineSettings(**SETTINGS, prefill_workers="127.0.0.1:1"), "decode")
        decode.client = PrefillClient("127.0.0.1:1")
        remote = RemoteConnector(RemotePrefill(decode.client, loop), slots=SourceSlots(2))
        connector = SelectiveConnector(remote, decode.client.breaker, min_tokens=10**6) if selective else remote
        check(decode, {"atom:requests_in_flight", *CLIENT})  # the client is made before the engine loads
        decode.engine = LLMEngine(decode.settings, connector=connector)
        remote.counters.remote_prefills = 3
        decode.client.stats.pd_retries = 2
        if selective:  # a prompt shorter than min_tokens is prefilled here
            decode.engine.generate(["hi"], SamplingParams(max_tokens=2))
        got = check(decode, ENGINE | REMOTE | CLIENT | ({"atom:pd_local_prefills"} if selective else set()))
        assert got["atom:pd_remote_prefills"] == ("counter", 3.0) and got["atom:pd_fetch_retries"] == ("counter", 2.0)
        if selective:
            assert got["atom:pd_local_prefills"] == ("counter", 1.0)
        covered |= set(got)
        await decode.client.close()

    # Prefill: the worker's, the service's and the queue's; in flight counts the KV transport's requests too.
    prefill = PrefillServer(EngineSettings(**{**SETTINGS, "lanes": 1, "kv_blocks": 3}), "prefill")
    check(prefill, {"atom:requests_in_flight"})
    with ThreadPoolExecutor(1) as pool:
        prefill.worker = PrefillWorker(prefill.settings)
        prefill.queue = PrefillQueue(pool, lambda args: 0)
        prefill.service = PrefillService(prefill.worker, prefill.queue, send_timeout=1.0)
        prefill.service.counters.prefill_in_flight = 2
        prefill.worker.counters.prefills_abandoned = 1
        got = check(prefill, PREFILL)
    assert got["atom:requests_in_flight"] == ("gauge", 2.0) and got["atom:prefills_abandoned"] == ("counter", 1.0)
    assert got["atom:kv_blocks_total"] == ("gauge", 3.0)
    covered |= set(got)

    assert covered == set(TABLE)  # every row resolves for some role


def test_a_misspelled_field_fails_loudly() -> None:
    with pytest.raises(AttributeError):
        Row("gauge", "doc", (BatcherStats.runing,))  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        Row("gauge", "doc", ("running",))  # type: ignore[arg-type]
    counters = BatcherCounters()
    with pytest.raises(AttributeError):
        counters.prompt_token += 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        counters.prompt_token = 1  # type: ignore[attr-defined]  # slots: no new attribute appears
    with pytest.raises(KeyError):
        counters["prompt_token"]
    # A figure that is not a stats object (the old dict of string keys) is refused at the first scrape.
    with pytest.raises(TypeError):
        ServerMetrics("m", lambda: [{"running": 1}]).render()
    # Two components reporting the same class would be ambiguous.
    with pytest.raises(ValueError, match="two components"):
        ServerMetrics("m", lambda: [InFlightStats(1), InFlightStats(2)]).render()


def test_a_renamed_field_fails_at_import() -> None:
    code = ("import atom_engine.stats as s\n"
            "del s.BatcherStats.waiting_for_kv\n"  # as if the field were renamed
            "import atom_engine.server.metrics\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "AttributeError" in r.stderr and "waiting_for_kv" in r.stderr
