"""The few PromQL shapes the dashboards repeat: a selector, a summed rate, a histogram's quantiles, a ratio."""

from __future__ import annotations

from atom_operator.dashboards.grafana import RATE, Target

QUANTILES = (0.5, 0.9, 0.99)


def selector(metric: str, matchers: str = "") -> str:
    return f"{metric}{{{matchers}}}" if matchers else metric


def rate(metric: str, matchers: str, by: str) -> str:
    """Per second over Grafana's rate interval, summed ``by`` those labels."""
    return f"sum by ({by}) (rate({selector(metric, matchers)}[{RATE}]))"


def ratio(numerator: str, denominator: str, matchers: str, by: str) -> str:
    """One counter's rate over another's (a hit rate, a failure share), both summed ``by`` the same labels."""
    return f"{rate(numerator, matchers, by)} / {rate(denominator, matchers, by)}"


def quantiles(histogram: str, matchers: str, by: str, legend: str) -> tuple[Target, ...]:
    """p50, p90 and p99 of a histogram (its ``_bucket`` series), per ``by``; ``legend`` names the group."""
    buckets = rate(f"{histogram}_bucket", matchers, f"le, {by}" if by else "le")
    return tuple(Target(f"histogram_quantile({q}, {buckets})", f"{legend} p{round(q * 100)}".strip())
                 for q in QUANTILES)


def rates(matchers: str, by: str, legend: str, *counters: tuple[str, str]) -> tuple[Target, ...]:
    """A target per (counter, what it counts): its rate summed ``by``, named ``legend`` and what."""
    return tuple(Target(rate(metric, matchers, by), f"{legend} {what}") for metric, what in counters)
