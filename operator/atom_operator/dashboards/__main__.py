"""Write the dashboards: ``python -m atom_operator.dashboards [--check] DIR DOC``.

DIR gets one ``<uid>.json`` per dashboard; DOC (docs/observability.md) its panels' table, between the
``dashboards:begin`` and ``dashboards:end`` markers. ``--check`` writes nothing and fails if either is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atom_operator.dashboards import DASHBOARDS, variables
from atom_operator.dashboards.grafana import Dashboard

BEGIN, END = "<!-- dashboards:begin (make dashboards) -->", "<!-- dashboards:end -->"
# The tables write the variables' matchers short, the longer first (it contains the other).
SHORT = (("$SELECTED", variables.SELECTED), ("$DEPLOYMENT", variables.DEPLOYMENT))


def render(d: Dashboard) -> str:
    return json.dumps(d.json(), indent=2, sort_keys=True) + "\n"


def files() -> dict[str, str]:
    return {f"{d.uid}.json": render(d) for d in DASHBOARDS}


def short(expr: str) -> str:
    for name, matchers in SHORT:
        expr = expr.replace(matchers, name)
    return expr.replace("|", "\\|")  # a table cell's pipe


def legend() -> str:
    return "In the queries, " + "; ".join(f"`{name}` stands for `{m}`" for name, m in SHORT) + "."


def table(d: Dashboard) -> str:
    rows = [f"**{d.title}** (`{d.uid}.json`): {d.description}", "", "| panel | query |", "| --- | --- |"]
    for p in d.panels:
        queries = "<br>".join(f"`{short(t.expr)}`" for t in p.targets)
        rows.append(f"| {p.title} | {queries} |")
    return "\n".join(rows)


def with_tables(doc: str) -> str:
    """``doc`` with its dashboards section (between the markers) made anew."""
    head, found, rest = doc.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise ValueError(f"the doc has no {BEGIN} ... {END} section for the dashboards' tables")
    return head + BEGIN + "\n" + "\n\n".join([legend(), *(table(d) for d in DASHBOARDS)]) + "\n" + END + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a written file differs, write nothing")
    parser.add_argument("dir", type=Path)
    parser.add_argument("doc", type=Path)
    args = parser.parse_args(argv)
    wanted = {args.dir / name: text for name, text in files().items()}
    wanted[args.doc] = with_tables(args.doc.read_text())
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
    stale += [p for p in args.dir.glob("*.json") if p not in wanted]
    if args.check:
        for p in stale:
            print(f"{p} is stale: run make dashboards", file=sys.stderr)
        return 1 if stale else 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for p in args.dir.glob("*.json"):
        if p not in wanted:
            p.unlink()  # a dashboard removed from the code leaves no ConfigMap behind
    for p, text in wanted.items():
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
