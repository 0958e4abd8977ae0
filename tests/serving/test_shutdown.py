"""Rollouts and restarts without failed requests: an engine told to stop drains first (``/ready`` 503, still
serving) and finishes what is in flight; a decoder whose prefill worker is not there yet waits for one, within
its bound. Real ``atom-engine serve`` processes on 127.0.0.1; prefill workers run with the operator's prefill
shapes (one lane, two blocks)."""

from __future__ import annotations

import asyncio
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.serving.conftest import (
    BASE,
    MODEL,
    Proc,
    assert_no_block_leaked,
    client,
    free_port,
    idle,
    in_process,
    reference_tokens,
    scrape,
    spawn,
    wait_metrics,
    wait_ready,
    wait_ready_sync,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
PREFILL = {**BASE, "lanes": 1, "kv_blocks": 2, "prefix_cache": False}  # what the operator renders for prefill
# Long enough that the test, not the clock, ends the drain (with a second signal).
SLOW_STOP = {"drain_seconds": 300, "finish_seconds": 120}


def ready_status(proc: Proc) -> int:
    try:
        with urllib.request.urlopen(f"{proc.url}/ready", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


async def until(probe, what: str, timeout: float = 60.0):  # noqa: ANN001, ANN201
    for _ in range(int(timeout / 0.05)):
        got = await asyncio.to_thread(probe)
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def exited(proc: Proc, timeout: float = 60.0) -> int:
    try:
        return proc.proc.wait(timeout)
    except Exception as exc:  # noqa: BLE001 - named below
        raise AssertionError(f"{proc.url} did not exit: {proc.log.read_text()[-2000:]}") from exc


async def test_sigterm_drains_then_finishes_in_flight_requests(tmp_path: Path, hold_dir: Path) -> None:
    worker = spawn(tmp_path, "prefill", "prefill", {**PREFILL, **SLOW_STOP}, faults=f"hold_dir={hold_dir}")
    decode = spawn(tmp_path, "decode", "decode", {**BASE, "lanes": 1, "kv_blocks": 2, "prefix_cache": False,
                                                  "local_prefill": False, "prefill_workers": worker.address,
                                                  **SLOW_STOP})
    try:
        await asyncio.gather(wait_ready(worker.url, worker), wait_ready(decode.url, decode))
        c = client(decode.url)
        expected = reference_tokens(["before", "draining", "HOLD:drain-a; in flight"], 6)

        async def ask(prompt: str) -> list[int]:
            out = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                             extra_body={"ignore_eos": True, "return_token_ids": True})
            return out.choices[0].token_ids

        assert await ask("before") == expected[0]
        for proc in (decode, worker):
            proc.proc.send_signal(signal.SIGTERM)
        # Draining: no longer ready (endpoints drop the pod), yet both still serve, new connections included.
        await until(lambda: ready_status(decode) == 503 and ready_status(worker) == 503, "/ready to turn 503")
        assert await ask("draining") == expected[1]

        # A request in flight (its prefill held) when the drain ends and the listeners close...
        held = asyncio.create_task(ask("HOLD:drain-a; in flight"))
        await wait_metrics(worker.url, lambda m: m["atom:prefill_requests_total"] >= 3, "the held prefill")
        decode.proc.send_signal(signal.SIGTERM)  # a second signal ends the drain now
        await until(lambda: refused(decode.port), "the decode listener to close")
        assert decode.proc.poll() is None  # ...keeps the process up until it is done,
        (hold_dir / "drain-a").touch()
        assert await asyncio.wait_for(held, 60) == expected[2]  # and finishes with every token.
        assert exited(decode) == 0, decode.log.read_text()[-2000:]
        worker.proc.send_signal(signal.SIGTERM)
        assert exited(worker) == 0, worker.log.read_text()[-2000:]
        assert "event=draining" in decode.log.read_text() and "event=stopped" in worker.log.read_text()
    finally:
        decode.kill()
        worker.kill()


async def test_a_decoder_waits_for_a_prefill_worker_that_is_not_there_yet(tmp_path: Path) -> None:
    port = free_port()  # nothing listens here until the worker below starts: connections are refused
    expected = reference_tokens(["waiting for a worker"], 6)[0]
    async with in_process("decode", lanes=1, kv_blocks=2, prefix_cache=False, local_prefill=False,
                          prefill_workers=f"127.0.0.1:{port}", pd_unavailable_wait_seconds=300) as (_s, url):
        task = asyncio.create_task(client(url).completions.create(
            model=MODEL, prompt="waiting for a worker", max_tokens=6, temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True}))
        # The decoder has found nobody at least twice (it is retrying, not failing)...
        await wait_metrics(url, lambda m: m["atom:pd_fetch_failures_total"] >= 2, "refused fetch attempts", 60)
        assert not task.done()
        worker = spawn(tmp_path, "late", "prefill", PREFILL, kv_port=port)
        try:
            await asyncio.to_thread(wait_ready_sync, worker)
            out = await asyncio.wait_for(task, 120)  # ...and the request succeeds once one is there.
            assert out.choices[0].token_ids == expected
            m = await wait_metrics(url, idle, "idle")
            assert m["atom:requests_failed_total"] == 0
            assert_no_block_leaked(m)
        finally:
            worker.kill()


async def test_with_no_prefill_worker_the_wait_is_bounded_by_a_503() -> None:
    port = free_port()  # never served
    async with in_process("decode", lanes=1, kv_blocks=2, prefix_cache=False, local_prefill=False,
                          prefill_workers=f"127.0.0.1:{port}", pd_unavailable_wait_seconds=0.5) as (_s, url):
        with pytest.raises(Exception) as info:  # noqa: PT011 - checked below
            await asyncio.wait_for(client(url).completions.create(model=MODEL, prompt="nobody", max_tokens=4), 60)
        assert getattr(info.value, "status_code", None) == 503, info.value
        assert info.value.body["code"] == "prefill_unavailable"
        assert f"127.0.0.1:{port}" in info.value.body["message"]
        m = await wait_metrics(url, idle, "idle")
        assert_no_block_leaked(m)
        assert (await scrape(url))["atom:pd_fetch_failures_total"] >= 2  # retried before giving up
