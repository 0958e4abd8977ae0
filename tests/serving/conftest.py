"""Real servers on 127.0.0.1: prefill workers as ``atom-engine serve`` subprocesses (they can be killed), decode
and standalone servers in this process on the session's event loop (cheap to start, easy to inspect), all on
free ports. Every wait is bounded."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio
import torch
import yaml
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.server.app import EngineServer, start_server
from atom_engine.settings import EngineSettings
from atom_localcluster.cluster import free_port

torch.set_num_threads(1)  # two shared cores: no spin-waiting torch pools


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The CLI run in process (test_cli) sizes torch's threads from the allowance: later in-process servers get one
    thread again, as the prefill workers beside them do (OMP_NUM_THREADS=1), so their logprobs agree bit for bit."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[2]
ENGINE_BIN = Path(sys.executable).parent / "atom-engine"
START_TIMEOUT = 120.0
MODEL = "tiny"
BASE = dict(model_name=MODEL, model_source="builtin:tiny", max_seq_len=512, prefill_chunk=32)


async def scrape(base_url: str) -> dict[str, float]:
    """/metrics as {name: value} (label-free names: one series per name, except vllm:request_success by reason,
    which this does not tell apart)."""
    async with aiohttp.ClientSession() as s, s.get(f"{base_url}/metrics", timeout=aiohttp.ClientTimeout(10)) as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name.split("{")[0]] = float(value)
    return out


async def wait_metrics(base_url: str, pred, what: str, timeout: float = 30.0) -> dict[str, float]:  # noqa: ANN001
    """Poll /metrics until ``pred(metrics)`` holds; fail with the last scrape after ``timeout`` seconds."""
    m: dict[str, float] = {}
    for _ in range(int(timeout / 0.02)):
        m = await scrape(base_url)
        if pred(m):
            return m
        await asyncio.sleep(0.02)
    shown = {k: v for k, v in m.items() if "bucket" not in k}
    raise AssertionError(f"timed out waiting for {what}; last metrics: {shown}")


def assert_no_block_leaked(m: dict[str, float]) -> None:
    """Idle engine: no lane holds a block or slot, and free + cached + scratch == kvBlocks."""
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m["atom:kv_blocks_lanes"] == 0
    assert m["atom:kv_blocks_pinned"] == 0
    assert m.get("atom:pd_source_slots_held", 0) == 0
    assert m["atom:kv_blocks_free"] + m["atom:kv_blocks_cached"] + 1 == m["atom:kv_blocks_total"]


def idle(m: dict[str, float]) -> bool:
    return m["atom:engine_idle"] == 1 and m["vllm:num_requests_running"] == 0


@dataclass
class Proc:
    """An ``atom-engine serve`` subprocess."""

    proc: subprocess.Popen
    port: int
    log: Path
    kv_port: int | None = None  # a prefill worker's KV transport

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """Where a decode pod reaches it (prefillWorkers): a prefill worker's KV port."""
        return f"127.0.0.1:{self.kv_port or self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def spawn(tmp: Path, name: str, role: str, settings: dict, env: dict[str, str] | None = None,
          port: int | None = None, engine_bin: Path = ENGINE_BIN, faults: str | None = None,
          kv_port: int | None = None) -> Proc:
    """``faults``: run it as :mod:`tests.serving.faulty_worker` with those faults armed (prefill role)."""
    if role == "prefill":
        kv_port = kv_port or free_port()
        settings = {**settings, "pd_kv_port": kv_port}
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump({_camel(k): v for k, v in settings.items()}))
    port = port or free_port()
    log = tmp / f"{name}.log"
    command = [str(engine_bin)] if faults is None else [sys.executable, "-m", "tests.serving.faulty_worker", faults]
    proc = subprocess.Popen(
        [*command, "serve", "--role", role, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    return Proc(proc, port, log, kv_port)


async def wait_ready(url: str, proc: Proc | None = None, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc is not None and proc.proc.poll() is not None:
                raise AssertionError(f"{url} exited with {proc.proc.returncode}: {proc.log.read_text()[-2000:]}")
            try:
                async with s.get(f"{url}/ready", timeout=aiohttp.ClientTimeout(2)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url} not ready after {timeout}s")


def wait_ready_sync(proc: Proc, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise AssertionError(f"{proc.url} exited with {proc.proc.returncode}: {proc.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{proc.url}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{proc.url} not ready after {timeout}s")


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(p.title() for p in rest)


@asynccontextmanager
async def in_process(role: str = "standalone", **settings: object) -> AsyncIterator[tuple[EngineServer, str]]:
    """An engine server on this event loop, ready, torn down after."""
    server, runner, port = await start_server(EngineSettings(**{**BASE, **settings}), role, "127.0.0.1", 0)
    try:
        await asyncio.wait_for(server.ready.wait(), START_TIMEOUT)
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


_clients: list[openai.AsyncOpenAI] = []


def client(url: str, **kwargs: object) -> openai.AsyncOpenAI:
    """An AsyncOpenAI client, closed after the test (see ``_close_clients``). No retries: every status code a
    test sees is the server's first answer."""
    c = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60.0, **kwargs)
    _clients.append(c)
    return c


@pytest_asyncio.fixture(autouse=True, loop_scope="session")
async def _close_clients() -> AsyncIterator[None]:
    # Close every client explicitly: clients left to the garbage collector were seen to close sockets that
    # had meanwhile been reused by newer connections, stalling requests of later servers.
    yield
    while _clients:
        await _clients.pop().close()


@pytest.fixture(scope="session")
def hold_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("holds")


FAULTS = "fail_marker=FAILME;corrupt_marker=CORRUPT;truncate_marker=TRUNCATE;oversize_marker=OVERSIZE;" \
         "slow_marker=SLOWLY"


@pytest.fixture(scope="session")
def prefill_pair(tmp_path_factory: pytest.TempPathFactory, hold_dir: Path) -> Iterator[list[Proc]]:
    """Two prefill workers (subprocesses) for the session, with the test-only faults armed
    (:mod:`tests.serving.faulty_worker`): prompts with FAILME fail (status 500), CORRUPT get a flipped payload
    byte, TRUNCATE half a frame, OVERSIZE a frame claiming 1 GiB, SLOWLY slow prefill chunks; HOLD:name; wait
    for hold_dir/name."""
    tmp = tmp_path_factory.mktemp("prefill")
    procs = [spawn(tmp, f"prefill-{i}", "prefill", {**BASE, "lanes": 1, "kv_blocks": 3, "prefix_cache": False},
                   faults=f"{FAULTS};hold_dir={hold_dir}") for i in range(2)]
    try:
        for p in procs:
            wait_ready_sync(p)
        yield procs
    finally:
        for p in procs:
            p.kill()


_reference: list[LLMEngine] = []


def reference_tokens(prompts: list[str], max_tokens: int, ignore_eos: bool = True) -> list[list[int]]:
    """Greedy outputs of a local standalone engine (one lane, no cache): what every server must reproduce."""
    if not _reference:
        _reference.append(LLMEngine(EngineSettings(**BASE, lanes=1, kv_blocks=2, prefix_cache=False)))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
    return [o.token_ids for o in _reference[0].generate(prompts, params)]
