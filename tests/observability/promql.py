"""What a PromQL expression names, read with a small tokenizer (promtool parses it; this only reads names): its
metrics, the labels each selector matches on, the labels it groups or joins by.

Enough for the dashboards' expressions: selectors ``name{label op "value", ...}``, ``by``/``without``/``on``/
``ignoring``/``group_left``/``group_right`` lists, ranges, numbers, functions and aggregations (a name followed by
``(``) and the binary keywords.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
            "atan2", "inf", "nan", "Inf", "NaN"}
STRING = r'"(?:[^"\\]|\\.)*"'
MATCHER = re.compile(rf"([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*{STRING}")
SELECTOR = re.compile(rf"(?<![\w:])([A-Za-z_:][\w:]*)?\s*\{{((?:[^}}\"]|{STRING})*)\}}")
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
NAME = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")


@dataclass
class Names:
    metrics: set[str] = field(default_factory=set)
    matched: dict[str, set[str]] = field(default_factory=dict)  # metric -> the labels its selector matches on
    grouped: set[str] = field(default_factory=set)  # labels of by/on/ignoring/group_* lists
    functions: set[str] = field(default_factory=set)


def names(expr: str) -> Names:
    out = Names()
    rest = expr
    for m in SELECTOR.finditer(expr):
        metric, labels = m.group(1), {lm.group(1) for lm in MATCHER.finditer(m.group(2))}
        if metric is None:  # {__name__="x", ...}
            raise ValueError(f"a selector without a metric name: {m.group(0)!r}")
        out.metrics.add(metric)
        out.matched.setdefault(metric, set()).update(labels)
    rest = SELECTOR.sub(lambda m: f" {m.group(1)} ", rest)
    for m in GROUPING.finditer(rest):
        out.grouped |= {label.strip() for label in m.group(2).split(",") if label.strip()}
    rest = GROUPING.sub(" ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", re.sub(STRING, " ", rest))  # ranges, strings
    for m in NAME.finditer(rest):
        name, call = m.group(1), m.group(2)
        if call:
            out.functions.add(name)
        elif name not in KEYWORDS:
            out.metrics.add(name)
            out.matched.setdefault(name, set())
    return out
