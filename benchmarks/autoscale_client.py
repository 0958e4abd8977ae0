"""The load client of ``make bench-autoscale``: standard library only, so it runs as ``python3 -c`` in a client
pod of the plain base image, against the AtomDeployment's Service (DNS name, ClusterIP, kube-proxy).

    python3 autoscale_client.py URL MODEL SCHEDULE_JSON SEED

SCHEDULE_JSON is a list of phases ``{"name", "seconds", "rate", "isl", "osl", "burst"?, "mix"?}``: Poisson arrivals
at ``rate`` per second for ``seconds`` (``burst`` requests at once at the phase's start; ``mix``: a list of
``[weight, isl, osl]`` shapes to draw from instead of one; ``osl_jitter``: each request's max_tokens drawn
uniformly within that fraction of ``osl``). A phase with ``"concurrency": C`` instead of ``rate`` is
closed loop: for ``seconds`` it starts a request whenever fewer than C of the client's requests are in flight (those
of earlier phases count). Requests still running at a phase's end finish normally. Every request is a streamed
``/v1/completions`` of ``isl`` random token ids with ``max_tokens=osl``, ``ignore_eos`` and
``stream_options.include_usage``; one JSON line per request on stdout when it ends (how it ended, when, its
first-token time), one line per phase start, and ``{"event": "done"}`` after the last request ended.
"""

from __future__ import annotations

import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

LOCK = threading.Lock()


CLOSED_LOOP_GAP = 0.05  # seconds between two starts of a closed-loop phase, at least


def emit(obj: dict) -> None:
    line = json.dumps(obj)
    with LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def one(url: str, model: str, rid: int, phase: str, isl: int, osl: int, seed: int) -> None:
    rng = random.Random(seed)
    body = json.dumps(
        {
            "model": model,
            "prompt": [rng.randrange(32, 200) for _ in range(isl)],
            "max_tokens": osl,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    u = urllib.parse.urlsplit(url)
    rec: dict = {
        "event": "request",
        "id": rid,
        "phase": phase,
        "isl": isl,
        "osl": osl,
        "start": time.time(),
        "status": None,
        "first": None,
        "end": None,
        "chunks": 0,
        "finish": None,
        "completion_tokens": None,
        "done": False,
        "error": None,
        "last_chunk": None,
    }
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=300)
    try:
        conn.request("POST", u.path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        rec["status"] = resp.status
        if resp.status != 200:
            rec["error"] = resp.read(300).decode(errors="replace")
        else:
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    rec["done"] = True
                    continue
                chunk = json.loads(data)
                if chunk.get("usage"):
                    rec["completion_tokens"] = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    if choice.get("text"):
                        rec["chunks"] += 1
                        rec["last_chunk"] = time.time()
                        if rec["first"] is None:
                            rec["first"] = rec["last_chunk"]
                    if choice.get("finish_reason"):
                        rec["finish"] = choice["finish_reason"]
    except Exception as e:  # noqa: BLE001 - every way a request can end is recorded
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        conn.close()
    rec["end"] = time.time()
    rec["ok"] = (
        rec["status"] == 200
        and rec["done"]
        and rec["finish"] is not None
        and rec["completion_tokens"] == osl
        and rec["error"] is None
    )
    emit(rec)


def main() -> None:
    url, model, schedule, seed = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    jitter = random.Random(seed + 1)
    threads: list[threading.Thread] = []
    rid = 0
    in_flight = 0
    ended = threading.Condition()  # notified whenever a request ends: a closed-loop phase starts the next one

    def request(n: int, phase: str, isl: int, osl: int) -> None:
        nonlocal in_flight
        try:
            one(url, model, n, phase, isl, osl, seed * 100003 + n)
        finally:
            with ended:
                in_flight -= 1
                ended.notify()

    def start(phase: dict, isl: int, osl: int) -> None:
        nonlocal rid, in_flight
        rid += 1
        with ended:
            in_flight += 1
        t = threading.Thread(target=request, args=(rid, phase["name"], isl, osl), daemon=True)
        t.start()
        threads.append(t)

    def shape(phase: dict) -> tuple[int, int]:
        if phase.get("mix"):
            total = sum(w for w, _, _ in phase["mix"])
            x = rng.random() * total
            for w, isl, osl in phase["mix"]:
                x -= w
                if x <= 0:
                    return isl, osl
        if phase.get("osl_jitter"):  # its own generator: the open-loop phases' draws stay as they were
            spread = phase["osl"] * phase["osl_jitter"]
            return phase["isl"], round(jitter.uniform(phase["osl"] - spread, phase["osl"] + spread))
        return phase["isl"], phase["osl"]

    for phase in schedule:
        began = time.time()
        emit({"event": "phase", "name": phase["name"], "t": began, **{k: v for k, v in phase.items() if k != "name"}})
        for _ in range(phase.get("burst", 0)):
            start(phase, *shape(phase))
        end = began + phase["seconds"]
        if phase.get("concurrency"):
            # Closed loop. The requests of earlier phases count towards the concurrency: a step down from a
            # closed-loop phase with more streams lets its streams end instead of adding this phase's to them.
            # Starts are spaced by CLOSED_LOOP_GAP at least, so requests refused at once (a Service without
            # endpoints) do not turn the loop into a busy one.
            last = 0.0
            with ended:
                while (now := time.time()) < end:
                    if now - last < CLOSED_LOOP_GAP:
                        ended.wait(CLOSED_LOOP_GAP - (now - last))
                    elif in_flight < phase["concurrency"]:
                        last = now
                        start(phase, *shape(phase))
                    else:
                        ended.wait(end - now)
            continue
        at = began
        while True:
            at += rng.expovariate(phase["rate"]) if phase["rate"] > 0 else phase["seconds"] + 1
            if at >= end:
                break
            time.sleep(max(0.0, at - time.time()))
            start(phase, *shape(phase))
        time.sleep(max(0.0, end - time.time()))
    emit({"event": "arrivals_end", "t": time.time(), "requests": rid})
    for t in threads:
        t.join()
    emit({"event": "done", "t": time.time()})


if __name__ == "__main__":
    main()
