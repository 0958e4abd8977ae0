"""Arrival rates for the decision, read over a window and cut at a change point. No I/O.

One decision interval holds few arrivals when prompts are long or streams last minutes: read over that interval
alone, two prompts that happen to arrive together look like twice the load, a role grows on a Poisson clump and
shrinks one scale-down window later. Read over a long window, a real load step shows only as a slow ramp. So each
decision adds its interval's counts (summed over the decode pods that answered) to a window of ``WINDOW_SECONDS``,
and the newest one to three intervals are tested against the rate of the ones before (since the last change
point, up to ``SHAPE_SECONDS``): a count so high that its Poisson tail at that rate is below ``ALPHA`` is a
change point, and the window restarts with the newest intervals. A step up in load then reads at once (in the
interval it happens, or the next), a steady load reads over the whole window, and a step down within one window
(a fall restarts the regime's means, below). Knative's autoscaler gets the same effect from a panic
window beside a stable one and a fixed threshold; a test on the count scales the threshold with the rate. The
intervals that make a change point were chosen for being busy, so the rate read in the window after one is taken
``STEP_CAUTION`` standard deviations of its count below the mean.

A fall restarts the regime's means only (decode's floor in a steady load): when the newest intervals, up to one
window of them, hold improbably few arrivals at the rate since the last change (the same Poisson tail), the means
are read over them. Nothing else moves: no step is read (a lull is no reason to grow), the window's rates and the
reference a rise is tested against stay as they were, so a false fall costs no more than a lower floor for a
while. Without it the means held the busier load for up to ``SHAPE_SECONDS`` after it ended: decode kept the
busier load's pods, reading its streams, long after the load fell. Up to one window of intervals is tested: a fall
to a few arrivals a window shows only over several of them, where a rise of the same size shows in one.

A change of the requests' shape is a change point too, where the count may not show it: when the newest
intervals' requests (at least ``MIX_REQUESTS``, within one window) ask ``MIX_FACTOR`` times more or fewer prompt
tokens or max_tokens each than the older ones (since the last new mix). The rates after it are read as they are,
not below their mean: its intervals were not chosen for their count. Without it, a load that turns from long
streams to short prompts at a like rate kept the streams' max_tokens in decode's regime reading for
``SHAPE_SECONDS``, and decode held NPUs that prefill needed.

Decode reads arrivals in two ways. After a change point (for one window) it reads the window's rate, to grow
before its lanes fill: a pod takes minutes to start. In a steady load its lanes decoding are the measure, and the
arrivals, read over the whole regime (up to ``SHAPE_SECONDS``), a floor: at their mean while requests queue for a
lane at a pod whose lanes are all held (the lanes decoding cannot show more than there are), else ``CAUTION``
standard deviations of their count below it: streams of a minute arrive a few per window, and their rate swings by
half where the lanes they hold do not.

Decode's lane time per max_token asked (its ``decode seconds / max_tokens`` of the requests that ended) is read
over the whole kept history, not restarted at change points: it describes the requests' shape, which a rate step
does not change, and completions come late for long streams. Its last known value is kept when no request ended
in the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW_SECONDS = 30.0  # the steady-load window (at least two decision intervals are kept)
SHAPE_SECONDS = 120.0  # the window the lane time per max_token is read over
# A count this improbable at the older intervals' rate is a change point: about one false restart in a few hundred
# decisions of steady load, while a step to a few times the rate shows in its first or second interval.
ALPHA = 1e-3
EXACT_BELOW = 50.0  # expected counts above this use the normal approximation of the Poisson tail
NEWEST = 3  # change points are looked for among the newest this many intervals
CAUTION = 2.0  # standard deviations of its count a steady rate is read below its mean
STEP_CAUTION = 1.0  # and a rate read just after a change point
# A request's mean prompt or max_tokens this many times off the older intervals' is a new mix. Each side's mean is
# over at least MIX_REQUESTS requests: a steady mix of short prompts and long streams (one in five or ten a stream)
# then seems to change about once in 600 decisions, while a switch between such loads shows within one window.
MIX_FACTOR = 3.0
MIX_REQUESTS = 30


@dataclass(frozen=True)
class Counts:
    """One interval's counts over the decode pods that answered (rates times the seconds they were read over)."""

    end: float
    seconds: float
    requests: float
    prompt_tokens: float
    max_tokens: float | None = None  # None: the pods do not report max_tokens at arrival
    decode_seconds: float = 0.0  # lane seconds of the requests that ended
    decoded_max_tokens: float = 0.0  # their max_tokens


@dataclass(frozen=True)
class Window:
    history: tuple[Counts, ...] = ()  # newest last, SHAPE_SECONDS of it
    since: float = -math.inf  # the last change point: rates read the intervals that end after it
    mixed_since: float = -math.inf  # the last new mix: a mix is compared with the intervals since (a rise's
    # few intervals may hold some of the old mix, and hold too few requests to compare with)
    fell_since: float = -math.inf  # the last fall: the regime's means are read over the intervals since
    seconds_per_max_token: float | None = None  # the last known lane time per max_token


@dataclass(frozen=True)
class Rates:
    requests: float
    prompt_tokens: float
    max_tokens: float | None
    seconds_per_max_token: float | None
    stepping: bool  # a change point within the last window: the rates read a step, not a steady load
    steady_max_tokens: float | None  # over the whole regime (its mean)
    steady_prompt_tokens: float = 0.0  # the same for prompt tokens
    steady_caution: float = 1.0  # the share of those means CAUTION standard deviations of the count below them


def window_seconds(interval: float) -> float:
    """The span a steady rate is read over: WINDOW_SECONDS, and at least two decision intervals."""
    return max(WINDOW_SECONDS, 2 * interval)


def _total(intervals: tuple[Counts, ...]) -> tuple[float, float]:
    return sum(c.requests for c in intervals), sum(c.seconds for c in intervals)


def tail(count: float, expected: float) -> float:
    """P(a Poisson count with this mean is at least as far from it as ``count``, on its side)."""
    n = round(count)
    if expected <= 0:
        return 0.0 if n > 0 else 1.0
    if expected > EXACT_BELOW:
        z = (abs(n - expected) - 0.5) / math.sqrt(expected)
        return 0.5 * math.erfc(max(z, 0.0) / math.sqrt(2))
    log_pmf = [-expected + k * math.log(expected) - math.lgamma(k + 1) for k in range(n + 1)]
    below = sum(math.exp(x) for x in log_pmf)  # P(N <= n)
    return below if n < expected else 1.0 - below + math.exp(log_pmf[n])


def rose(older: tuple[Counts, ...], newer: tuple[Counts, ...]) -> bool:
    """Whether ``newer``'s arrivals are improbably many at ``older``'s rate (a Poisson tail below ALPHA).

    Only a rise restarts the window: a fall may wait for the window (scale-down waits for its own anyway), and
    a window restarted on a lull would read the next clump over a few seconds."""
    count, seconds = _total(newer)
    before, span = _total(older)
    if span < seconds or span <= 0:
        return False
    expected = (before + 1) / span * seconds  # one arrival more: after an idle spell, one arrival is no step
    return count > expected and tail(count, expected) < ALPHA


def fell(older: tuple[Counts, ...], newer: tuple[Counts, ...]) -> bool:
    """Whether ``newer``'s arrivals are improbably few at ``older``'s rate (a Poisson tail below ALPHA)."""
    count, seconds = _total(newer)
    before, span = _total(older)
    if span < seconds or span <= 0:
        return False
    expected = before / span * seconds
    return count < expected and tail(count, expected) < ALPHA


def _per_request(intervals: tuple[Counts, ...]) -> tuple[float, float | None]:
    requests, _ = _total(intervals)
    prompts = sum(c.prompt_tokens for c in intervals) / requests
    known = all(c.max_tokens is not None for c in intervals)
    return prompts, sum(c.max_tokens or 0.0 for c in intervals) / requests if known else None


def remixed(intervals: tuple[Counts, ...], interval: float) -> int:
    """How many of the newest intervals hold a new mix of requests (see MIX_FACTOR); 0 for none.

    The newest intervals that hold MIX_REQUESTS requests, within one window, against the ones before them."""
    most = max(1, round(window_seconds(interval) / interval))
    for k in range(1, min(most, len(intervals) - 1) + 1):
        newer, older = intervals[-k:], intervals[:-k]
        if _total(newer)[0] < MIX_REQUESTS:
            continue
        if _total(older)[0] < MIX_REQUESTS:
            return 0
        now, before = _per_request(newer), _per_request(older)
        changed = [i for i, (a, b) in enumerate(zip(now, before, strict=True))
                   if a is not None and b is not None and max(a, b) > MIX_FACTOR * min(a, b)]  # fmt: skip
        if not changed:
            return 0
        # The newer side's oldest intervals may still be the old mix (it took them to reach MIX_REQUESTS): those
        # closer to it stay out of the new regime, where they would hold the old mix for SHAPE_SECONDS.
        while k > 1 and newer[0].requests and _closer_to_older(newer[0], now, before, changed):
            k, newer = k - 1, newer[1:]
        return k
    return 0


def _closer_to_older(c: Counts, now: tuple, before: tuple, changed: list[int]) -> bool:
    own = _per_request((c,))
    return all(abs(math.log(max(own[i], 1e-9) / before[i])) < abs(math.log(max(own[i], 1e-9) / now[i]))
               for i in changed)  # fmt: skip


def add(window: Window, counts: Counts, interval: float) -> tuple[Window, Rates]:
    """The window with this interval's counts, and the rates the decision reads now."""
    history = tuple(c for c in window.history if counts.end - c.end < SHAPE_SECONDS) + (counts,)
    since, mixed_since, fell_since = window.since, window.mixed_since, window.fell_since
    regime = tuple(c for c in history if c.end > since)  # the reference a rise is tested against: all of it
    for k in range(1, min(NEWEST, len(regime) - 1) + 1):
        if rose(regime[:-k], regime[-k:]):
            since = regime[-k - 1].end
            break
    else:
        mix = tuple(c for c in history if c.end > mixed_since)
        if k := remixed(mix, interval):
            mixed_since = mix[-k - 1].end
            since = max(since, mixed_since)
        else:
            settled = tuple(c for c in regime if c.end > fell_since)
            most = max(1, round(window_seconds(interval) / interval))
            for k in range(1, min(most, len(settled) - 1) + 1):
                if fell(settled[:-k], settled[-k:]):
                    fell_since = settled[-k - 1].end
                    break
    regime = tuple(c for c in history if c.end > since)
    settled = tuple(c for c in regime if c.end > fell_since)  # what the steady means are read over
    current = tuple(c for c in regime if counts.end - c.end < window_seconds(interval))
    requests, seconds = _total(current)
    shape = [c for c in history if c.decoded_max_tokens > 0]
    decoded = sum(c.decoded_max_tokens for c in shape)
    per_token = sum(c.decode_seconds for c in shape) / decoded if decoded else window.seconds_per_max_token
    known = all(c.max_tokens is not None for c in regime)
    count, span = _total(settled)
    cautious = max(0.0, count - CAUTION * math.sqrt(count)) / count if count else 0.0
    stepping = counts.end - since < WINDOW_SECONDS
    # After a rise the window holds the few intervals whose count made it: chosen for being high, they read high.
    # One deviation of their count off keeps the first move from overshooting the step. A new mix's intervals were
    # chosen for their requests' shape, not their count: they read as they are.
    rising = stepping and since > mixed_since
    step = max(0.0, requests - STEP_CAUTION * math.sqrt(requests)) / requests if rising and requests else 1.0
    rates = Rates(
        requests / seconds * step,
        sum(c.prompt_tokens for c in current) / seconds * step,
        sum(c.max_tokens or 0.0 for c in current) / seconds * step if known else None,
        per_token,
        stepping,
        sum(c.max_tokens or 0.0 for c in settled) / span if known else None,
        sum(c.prompt_tokens for c in settled) / span,
        cautious,
    )
    return Window(history, since, mixed_since, fell_since, per_token), rates
