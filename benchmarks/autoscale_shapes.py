"""Seeded load shapes for the autoscaling simulator (`make bench-autoscale-sim`): families of shapes, each drawn
from its own seeded generator, so a run is a sample of a family, not one tuned trace.

A shape is a rate and a mix of requests per segment (``SEGMENT_S`` seconds), plus what the cluster does to the
fleet: how long a pod takes from creation to Ready, how many pods the node holds, when the pods' metrics go dark.
Arrivals are drawn once per shape (:func:`arrivals`) and every controller sees the same ones.

Requests are of two classes, a chat class and a second one (retrieval-augmented prompts, or long prompts), whose
share moves per segment; with ``sigma`` > 0 their prompt and output lengths are lognormal around the same means.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

SEGMENT_S = 5.0
DURATION_S = 1200.0
CHAT = (200.0, 150.0)  # mean prompt tokens, mean output tokens
RAG = (2000.0, 60.0)
LONG = (8000.0, 20.0)
DEFAULT_START_S = 60.0


@dataclass(frozen=True)
class Shape:
    family: str
    seed: int
    rate: np.ndarray  # requests per second, per segment
    share: np.ndarray  # share of the second class, per segment
    second: tuple[float, float]  # the second class's mean prompt and output tokens
    sigma: float = 0.0  # lognormal sigma of both lengths (0: constant)
    start_s: float = DEFAULT_START_S  # creation to Ready
    room: int | None = None  # pods the node holds (None: unbounded)
    outages: tuple[tuple[float, float], ...] = ()  # [from, to) seconds when no pod's metrics can be read
    note: str = field(default="", compare=False)

    @property
    def duration(self) -> float:
        return len(self.rate) * SEGMENT_S

    def means(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean prompt and output tokens of a request, per segment."""
        isl = (1 - self.share) * CHAT[0] + self.share * self.second[0]
        osl = (1 - self.share) * CHAT[1] + self.share * self.second[1]
        return isl, osl


@dataclass(frozen=True)
class Arrivals:
    time: np.ndarray  # seconds, sorted
    isl: np.ndarray
    osl: np.ndarray


def arrivals(shape: Shape) -> Arrivals:
    """Poisson arrivals at each segment's rate, each request's class and lengths drawn from the segment's mix."""
    rng = np.random.default_rng([shape.seed, 1])
    counts = rng.poisson(shape.rate * SEGMENT_S)
    segment = np.repeat(np.arange(len(counts)), counts)
    time = np.sort((segment + rng.random(len(segment))) * SEGMENT_S)
    segment = np.minimum((time // SEGMENT_S).astype(int), len(counts) - 1)
    second = rng.random(len(time)) < shape.share[segment]
    mean_isl = np.where(second, shape.second[0], CHAT[0])
    mean_osl = np.where(second, shape.second[1], CHAT[1])
    if shape.sigma > 0:  # lognormal with the same mean: mu = ln(mean) - sigma^2 / 2
        s = shape.sigma
        isl = np.exp(np.log(mean_isl) - s * s / 2 + s * rng.standard_normal(len(time)))
        osl = np.exp(np.log(mean_osl) - s * s / 2 + s * rng.standard_normal(len(time)))
    else:
        isl, osl = mean_isl, mean_osl
    return Arrivals(time, np.maximum(1.0, np.round(isl)), np.maximum(1.0, np.round(osl)))


def _segments() -> int:
    return int(DURATION_S / SEGMENT_S)


def _t() -> np.ndarray:
    return np.arange(_segments()) * SEGMENT_S


def _phases(rng: np.random.Generator, low_s: float, high_s: float) -> np.ndarray:
    """Which of two levels each segment is at: alternating phases, each held for a drawn time."""
    out, i, t = np.empty(_segments(), dtype=int), 0, 0
    while t < _segments():
        hold = int(rng.uniform(low_s, high_s) / SEGMENT_S)
        out[t : t + hold] = i % 2
        t, i = t + hold, i + 1
    return out


def _steps(rng: np.random.Generator, levels: list[float], low_s: float, high_s: float) -> np.ndarray:
    """A piecewise constant series alternating between two ``levels``, each held for a drawn time."""
    return np.asarray(levels)[_phases(rng, low_s, high_s)]


def diurnal(rng: np.random.Generator, seed: int) -> Shape:
    base, peak = rng.uniform(0.1, 0.4), rng.uniform(1.0, 2.5)
    phase = rng.uniform(0, 2 * math.pi)
    rate = base + (peak - base) * (1 - np.cos(2 * math.pi * _t() / DURATION_S + phase)) / 2
    return Shape("diurnal ramps", seed, rate, np.zeros(_segments()), RAG)


def bursts(rng: np.random.Generator, seed: int) -> Shape:
    rate = _steps(rng, [rng.uniform(0.1, 0.3), rng.uniform(1.2, 2.5)], 90, 300)
    return Shape("on/off bursts", seed, rate, np.zeros(_segments()), RAG)


def sawtooth(rng: np.random.Generator, seed: int) -> Shape:
    lo, hi, period = rng.uniform(0.1, 0.3), rng.uniform(1.2, 2.5), rng.uniform(150, 360)
    rate = lo + (hi - lo) * ((_t() % period) / period)
    return Shape("sawtooth", seed, rate, np.zeros(_segments()), RAG)


def long_prompts(rng: np.random.Generator, seed: int) -> Shape:
    base = rng.uniform(0.3, 0.8)
    spike_rate = rng.uniform(0.15, 0.35)
    rate, share = np.full(_segments(), base), np.zeros(_segments())
    for _ in range(int(rng.integers(2, 4))):
        at, hold = int(rng.uniform(60, DURATION_S - 200) / SEGMENT_S), int(rng.uniform(60, 150) / SEGMENT_S)
        rate[at : at + hold] = base + spike_rate
        share[at : at + hold] = spike_rate / (base + spike_rate)
    return Shape("long-prompt spikes", seed, rate, share, LONG)


def mix_shift(rng: np.random.Generator, seed: int) -> Shape:
    rate = np.full(_segments(), rng.uniform(0.6, 1.2))
    share = _steps(rng, [0.0, rng.uniform(0.6, 1.0)], 200, 400)
    return Shape("chat->RAG mix shifts", seed, rate, share, RAG)


def heavy_tails(rng: np.random.Generator, seed: int) -> Shape:
    rate = np.full(_segments(), rng.uniform(0.5, 1.8))
    return Shape("heavy-tailed lengths", seed, rate, np.full(_segments(), 0.2), RAG, sigma=rng.uniform(0.8, 1.4))


def outages(rng: np.random.Generator, seed: int) -> Shape:
    shape = bursts(rng, seed)
    spans = []
    for _ in range(int(rng.integers(1, 3))):
        at = rng.uniform(100, DURATION_S - 300)
        spans.append((at, at + rng.uniform(60, 180)))
    return Shape("metrics outages", seed, shape.rate, shape.share, RAG, outages=tuple(sorted(spans)))


def slow_starts(rng: np.random.Generator, seed: int) -> Shape:
    rate = _steps(rng, [rng.uniform(0.1, 0.3), rng.uniform(1.0, 2.2)], 360, 500)
    share = np.full(_segments(), rng.uniform(0.0, 0.4))
    return Shape("60-300 s starts", seed, rate, share, RAG, start_s=float(rng.uniform(60, 300)))


def full_node(rng: np.random.Generator, seed: int) -> Shape:
    # Long phases that each want a little more than the node's 8 pods, in turn decode-heavy (many chats) and
    # prefill-heavy (retrieval prompts).
    phase = _phases(rng, 300, 480)
    rate = np.array([rng.uniform(2.0, 2.3), rng.uniform(1.15, 1.3)])[phase]
    share = np.array([rng.uniform(0.05, 0.15), rng.uniform(0.65, 0.8)])[phase]
    return Shape("full node", seed, rate, share, RAG, room=8)


def saturated(rng: np.random.Generator, seed: int) -> Shape:
    rate = _steps(rng, [rng.uniform(2.5, 4.0), rng.uniform(3.0, 5.0)], 300, 600)
    return Shape("node saturated", seed, rate, np.full(_segments(), rng.uniform(0.3, 0.6)), RAG, room=8)


FAMILIES: list[Callable[[np.random.Generator, int], Shape]] = [
    diurnal, bursts, sawtooth, long_prompts, mix_shift, heavy_tails, outages, slow_starts, full_node, saturated,
]  # fmt: skip


def shapes(count: int, seed: int = 0) -> list[Shape]:
    """``count`` shapes, the families in turn, each drawn from its own seed."""
    out = []
    for i in range(count):
        family = FAMILIES[i % len(FAMILIES)]
        shape_seed = seed * 100_003 + i
        out.append(family(np.random.default_rng([shape_seed, 0]), shape_seed))
    return out
