"""Host overhead of the engine core: how close the engine comes to the device's limit when the device is fast.

A stand-in runner (here, never in the engine) whose every forward takes a fixed device time, sleeping with the
GIL released as a device call does, and returns a token chosen by a hash of the lane's context, drives the real
batcher, output processor (with SmolLM2's tokenizer when ``make model`` converted it, else the byte tokenizer)
and step loop: serially (plan, run, apply and make the outputs in turn) and overlapped (while the device runs a
step, the host thread applies the last one, makes its outputs and plans the next: :mod:`atom_engine.overlap`).
The limit is ``lanes / step time`` tokens per second; the host overhead per step is the wall time per step beyond
the device's.

A negative control: a run whose stand-in also burns host CPU inside its step (a device call that holds the GIL,
which no overlap can hide) must come out below the limit, or the harness cannot see host work at all.

Writes benchmarks/results/host.md. Usage: python benchmarks/bench_host.py [--step-ms 5] [--lanes 8 16 32 64]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from atom_engine import limits
from atom_engine.batcher import Batcher
from atom_engine.capabilities import Capabilities
from atom_engine.kv_blocks import KVBlocks
from atom_engine.model.builtin import checkpoint_path
from atom_engine.model.tokenizer import ByteTokenizer, HFTokenizer
from atom_engine.overlap import OverlappedSteps
from atom_engine.sequence import SamplingParams, Sequence

RESULTS = Path(__file__).parent / "results" / "host.md"
VOCAB = 4096  # token ids the stand-in returns (within SmolLM2's vocabulary: real text to detokenize)


class FixedTimeRunner:
    """Every forward takes ``step`` seconds of device time (time.sleep releases the GIL, as a device call
    does); ``host_burn``: seconds of Python work inside the forward as well (the negative control).

    A sleep wakes late (timer slack and the scheduler's wake-up: about 0.1 ms on a VM), so the stand-in sleeps
    ``step`` less the median overshoot measured at start, and its forwards take ``step`` as a device's would;
    ``durations`` is what each took. The tokens are made from the inputs read at launch, as a device computes them
    within its step: after the sleep the forward only returns them."""

    capabilities = Capabilities(mixed=True)  # prefill chunks ride in the decode forward: one device call a step

    def __init__(self, step: float, host_burn: float = 0.0, overshoot: float = 0.0) -> None:
        self.step, self.host_burn = step, host_burn
        self._sleep = max(0.0, step - overshoot)
        self.durations: list[float] = []  # seconds each forward took

    def _device(self) -> None:
        t0 = time.perf_counter()
        time.sleep(self._sleep)
        end = time.perf_counter() + self.host_burn
        while time.perf_counter() < end:  # holds the GIL
            pass
        self.durations.append(time.perf_counter() - t0)

    @staticmethod
    def _token(seq: Sequence, extra: int = 0) -> int:
        return (seq.last_token * 31 + len(seq.output) * 7 + extra) % VOCAB

    def prefill(self, seq: Sequence, start: int, tokens: list[int], last: bool) -> int | None:
        token = self._token(seq) if last else None
        self._device()
        return token

    def decode(self, batch: list[Sequence | None]) -> list[int | None]:
        # _token inlined: the inputs a runner reads at launch (each lane's last token and position), no more
        tokens = [None if s is None else ((s.output[-1] if s.output else s.prompt[-1]) * 31 + len(s.output) * 7)
                  % VOCAB for s in batch]
        self._device()
        return tokens

    def verify(self, batch: list[Sequence | None], drafts: list[list[int]]) -> list[list[int] | None]:
        return [None if t is None else [t] for t in self.decode(batch)]

    def mixed(self, batch: list[Sequence | None], drafts: list[list[int]],
              chunks: list[tuple[Sequence, int, list[int], bool]]) -> tuple[list[list[int] | None], list[int | None]]:
        news = [None if s is None else [self._token(s)] for s in batch]
        firsts = [self._token(seq, 1) if last else None for seq, _, _, last in chunks]
        self._device()
        return news, firsts

    def copy_block(self, src: int, dst: int) -> None:
        pass

    def load_kv(self, seq: Sequence, loaded: object) -> int:
        raise AssertionError("no KV connector here")


def sleep_overshoot(step: float, samples: int = 200) -> float:
    """The median time a sleep of ``step`` takes beyond it, on this machine now."""
    late = []
    for _ in range(samples):
        t0 = time.perf_counter()
        time.sleep(step)
        late.append(time.perf_counter() - t0 - step)
    return statistics.median(late)


def tokenizer() -> tuple[object, str]:
    try:
        path = checkpoint_path("builtin:smollm2-135m")
    except ValueError:
        path = None
    if path is not None and (path / "tokenizer.json").is_file():
        return HFTokenizer(path / "tokenizer.json", None), "SmolLM2-135M's tokenizer.json"
    return ByteTokenizer(), "the byte tokenizer (run `make model` for SmolLM2's)"


def run(lanes: int, step: float, tokens: int, overlap: bool, decode, host_burn: float = 0.0,  # noqa: ANN001
        overshoot: float = 0.0) -> dict[str, float]:
    runner = FixedTimeRunner(step, host_burn, overshoot)
    kv = KVBlocks(limits.min_kv_blocks(lanes, False), prefix_cache=False)
    b = Batcher(runner, kv, lanes=lanes, max_seq_len=tokens + 64, prefill_chunk=64, detokenize=decode)
    steps = OverlappedSteps(b, runner) if overlap else b
    # One wave filling every lane: prompts of 32 tokens, each request decoding `tokens` greedy tokens, with a
    # stop string it never meets (so the stop-string search runs every token, as a chat request's would).
    params = SamplingParams(max_tokens=tokens, stop=("\x00never\x00",), ignore_eos=True)
    seqs = [b.add([(i * 17 + j) % VOCAB for j in range(32)], params) for i in range(lanes)]
    handed = []  # as the server's loop hands each step's outputs to the event loop, not read on this thread
    t0 = time.perf_counter()
    while b.has_work() or (overlap and steps.holding):
        handed.append(steps.step())
    wall = time.perf_counter() - t0
    delivered = sum(len(o.new_tokens) for outs in handed for o in outs)
    if overlap:
        steps.close()
    assert all(s.finish_reason == "length" and len(s.output) == tokens for s in seqs)
    assert delivered == lanes * tokens
    return {"wall": wall, "forwards": len(runner.durations), "tokens": delivered,
            "busy": sum(runner.durations) / wall,
            "forward": statistics.median(runner.durations), "outputs": tuple(tuple(s.output) for s in seqs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--lanes", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--tokens", type=int, default=96, help="output tokens per request")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--burn-ms", type=float, default=2.0, help="the negative control's host work per step")
    args = ap.parse_args()
    step = args.step_ms / 1000
    tok, tok_name = tokenizer()
    rows = []
    overshoots = []
    for lanes in args.lanes:
        overshoots.append(sleep_overshoot(step))  # again per row: the machine's load moves it
        per: dict[str, list[dict]] = {"serial": [], "overlapped": []}
        for _ in range(args.rounds):  # interleaved: the machine's noise hits both alike
            for mode in per:
                per[mode].append(run(lanes, step, args.tokens, mode == "overlapped", tok.decode,
                                     overshoot=overshoots[-1]))
        assert per["serial"][0]["outputs"] == per["overlapped"][0]["outputs"], "overlap changed the tokens"
        limit = lanes / step
        for mode, runs in per.items():
            walls = [r["wall"] for r in runs]
            wall = statistics.median(walls)
            forwards = runs[0]["forwards"]
            tps = runs[0]["tokens"] / wall
            busy = statistics.median(r["busy"] for r in runs)
            between = statistics.median(r["wall"] * (1 - r["busy"]) / forwards for r in runs)
            forward = statistics.median(r["forward"] for r in runs)
            rows.append((lanes, mode, tps, limit, tps / limit, forward * 1000, busy, (wall / forwards - step) * 1000,
                         between * 1000, min(walls), max(walls), forwards))
        print(rows[-2], rows[-1], flush=True)
    control = [run(32 if 32 in args.lanes else args.lanes[0], step, args.tokens, True, tok.decode,
                   host_burn=args.burn_ms / 1000, overshoot=statistics.median(overshoots)) for _ in range(3)]
    c_lanes = 32 if 32 in args.lanes else args.lanes[0]
    c_wall = statistics.median(r["wall"] for r in control)
    c_ratio = control[0]["tokens"] / c_wall / (c_lanes / step)
    load = os.getloadavg()[0]
    lines = [
        "# Host overhead: serial vs overlapped steps against a fixed-time device",
        "",
        f"A stand-in runner whose every forward takes {args.step_ms:g} ms (a sleep, the GIL released, as a device"
        " call; shortened by the sleep's median overshoot, measured before each row:"
        f" {min(overshoots) * 1000:.3f}-{max(overshoots) * 1000:.3f} ms, so that a forward takes its nominal time;"
        " the tokens made from the inputs read at launch) drives the real batcher, plan executor and output"
        " processor; one wave of requests fills every lane"
        f" (prompts of 32 tokens, {args.tokens} output tokens each, greedy, a stop string searched every token),"
        f" detokenized with {tok_name}; each step's outputs are handed off unread, as the server's loop hands them"
        " to the event loop. The limit is lanes / step time; forward ms is the median time a forward took; host"
        " overhead per step is the wall time per forward beyond the nominal step; device busy is the share of the"
        " wall time spent inside forwards, and between forwards the wall time outside them per forward (the"
        " host's serial part). Median of"
        f" {args.rounds} rounds, serial and overlapped interleaved; {os.cpu_count()} CPUs ({platform.machine()}),"
        f" load average {load:.1f} at the end (the machine is shared: noisy). Both modes produce the same tokens"
        " (checked).",
        "",
        "| lanes | steps | tok/s | limit tok/s | of the limit | forward ms | device busy | host overhead ms/step |"
        " between forwards ms/step | wall s min..max | forwards |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lanes, mode, tps, limit, ratio, forward, busy, overhead, between, lo, hi, forwards in rows:
        lines.append(f"| {lanes} | {mode} | {tps:.0f} | {limit:.0f} | {ratio * 100:.1f} % | {forward:.3f} |"
                     f" {busy * 100:.1f} % |"
                     f" {overhead:.2f} | {between:.2f} | {lo:.3f}..{hi:.3f} | {forwards} |")
    lines += [
        "",
        f"Negative control: the same overlapped run at {c_lanes} lanes with {args.burn_ms:g} ms of host work"
        f" inside each forward (holding the GIL, which no overlap can hide): {c_ratio * 100:.1f} % of the limit"
        f" (it can be at most {step / (step + args.burn_ms / 1000) * 100:.1f} %), so the harness sees host work.",
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
