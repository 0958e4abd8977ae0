"""``atom-engine serve``: bad settings stop the process before the model loads, with the rule's message; a good
config serves the OpenAI API (the sync ``openai`` client against the real process)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import openai
import pytest
import yaml

from tests.serving.conftest import BASE, ENGINE_BIN, MODEL, reference_tokens, spawn, wait_ready_sync


def run_cli(tmp_path: Path, role: str, settings: dict) -> subprocess.CompletedProcess:
    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump(settings))
    return subprocess.run([str(ENGINE_BIN), "serve", "--role", role, "--config", str(config), "--host", "127.0.0.1",
                           "--port", "1"], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("role", "settings", "message"),
    [
        ("decode", {"lanes": 2, "kvBlocks": 4, "prefetchNext": True, "localPrefill": False,
                    "prefillWorkers": "p:8000"}, "prefill.prefetchNext needs decode.lanes == 1; got decode.lanes = 2"),
        ("decode", {"lanes": 1, "kvBlocks": 3, "prefetchNext": True}, "prefill.prefetchNext needs prefill.replicas"),
        ("decode", {"lanes": 1, "kvBlocks": 3, "prefetchNext": True, "prefillWorkers": "p:8000"},
         "prefill.prefetchNext needs decode.localPrefill == false; got decode.localPrefill = true"),
        ("standalone", {"lanes": 4, "kvBlocks": 5, "prefixCache": True}, "decode.kvBlocks must be >= decode.lanes + 2"),
        ("decode", {"localPrefill": False}, "remote-only prefill needs a prefill worker"),
        ("standalone", {"lanes": "many"}, "valid integer"),
        ("decode", {"backend": "rngd", "prefixCache": False},
         "backend 'rngd' cannot run the decode role (it takes atom, cpu); rngd runs prefill only"),
        ("standalone", {"backend": "rngd", "prefixCache": False}, "backend 'rngd' cannot run the standalone role"),
        ("prefill", {"backend": "rngd"}, "backend rngd runs prefill workers, which run without a prefix cache"),
    ],
)
def test_bad_settings_stop_the_process_before_the_model_loads(tmp_path: Path, role: str, settings: dict,
                                                               message: str) -> None:
    done = run_cli(tmp_path, role, settings)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "event=starting" not in done.stderr  # refused before anything was loaded or bound


def test_serve_standalone_answers_the_openai_client(tmp_path: Path) -> None:
    proc = spawn(tmp_path, "standalone", "standalone", {**BASE, "lanes": 2, "kv_blocks": 4})
    try:
        wait_ready_sync(proc)
        with openai.OpenAI(base_url=f"{proc.url}/v1", api_key="none", max_retries=0, timeout=60) as c:
            out = c.completions.create(model=MODEL, prompt="hello", max_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
            assert out.choices[0].token_ids == reference_tokens(["hello"], 5)[0]
            chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=3, temperature=0, stream=True)
            assert sum(1 for ch in chat if ch.choices and ch.choices[0].finish_reason == "length") == 1
    finally:
        proc.proc.terminate()
        assert proc.proc.wait(30) == 0  # SIGTERM drains and exits cleanly
    assert "event=request_done" in proc.log.read_text()  # structured logs with request ids


def test_metrics_port_serves_the_same_metrics_alone(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    from tests.serving.conftest import free_port

    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump({"lanes": 2, "kvBlocks": 4}))
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "engine.log"
    proc = subprocess.Popen([str(ENGINE_BIN), "serve", "--role", "standalone", "--config", str(config), "--host",
                             "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        from tests.serving.conftest import Proc

        wait_ready_sync(Proc(proc, port, log))
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            assert "vllm:num_requests_running" in r.read().decode()
        with pytest.raises(urllib.error.HTTPError) as err:  # only /metrics lives there
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/v1/models", timeout=10)
        assert err.value.code == 404
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_the_served_metrics_say_how_many_cpu_threads_and_which_bound_chose_them(tmp_path: Path) -> None:
    import urllib.request

    from atom_engine.cpu_allowance import CPU_REQUEST_ENV

    # No OMP_NUM_THREADS (spawn's default would win as an explicit choice): the pod's half-CPU request is the
    # tightest bound, and the metric must name it as the start-up log does.
    proc = spawn(tmp_path, "standalone", "standalone", {**BASE, "lanes": 2, "kv_blocks": 4},
                 env={"OMP_NUM_THREADS": "", "OMP_WAIT_POLICY": "", CPU_REQUEST_ENV: "500"})
    try:
        wait_ready_sync(proc)
        with urllib.request.urlopen(f"{proc.url}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        proc.proc.terminate()
        assert proc.proc.wait(30) == 0
    log = proc.log.read_text()
    assert "event=cpu_threads threads=1 source=pod-request" in log
    assert "omp_wait_policy=PASSIVE" in log  # set before torch loaded: the CLI imports nothing of torch first
    assert 'atom:cpu_threads_info{source="pod-request",threads="1"} 1.0' in metrics
    assert f'atom:cpu_threads{{model_name="{MODEL}"}} 1.0' in metrics  # the existing series, unchanged
