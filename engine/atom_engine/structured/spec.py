"""What a request's structured output asks for: one grammar source, as data (a cache key, shippable as is)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["json_schema", "json_object", "regex", "choice", "grammar", "structural_tag", "any_of"]


@dataclass(frozen=True)
class GrammarSpec:
    """``source``: the schema as canonical JSON (``json_schema``), the regex, the choices as a JSON list, the
    EBNF text (``grammar``), xgrammar's structural tag as JSON (``structural_tag``: tagged JSON such as tool
    calls), or the specs of which the output follows any one (``any_of``: :meth:`any_of`); empty for
    ``json_object``. ``any_whitespace``: JSON may hold any whitespace between its tokens
    (vLLM's default); off, JSON is written on one line with single spaces after separators, so a sampling model
    cannot pad with whitespace until max_tokens cuts the object off."""

    kind: Kind
    source: str = ""
    any_whitespace: bool = False

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool, any_whitespace: bool = False) -> GrammarSpec:
        # Key order is kept: a schema's property order is the output's.
        return cls("json_schema", json.dumps(schema, separators=(",", ":")), any_whitespace)

    @classmethod
    def choice(cls, options: list[str]) -> GrammarSpec:
        return cls("choice", json.dumps(list(options)))

    @classmethod
    def any_of(cls, *parts: GrammarSpec) -> GrammarSpec:
        """An output that follows one of ``parts`` (xgrammar's union of their grammars)."""
        return cls("any_of", json.dumps([[p.kind, p.source, p.any_whitespace] for p in parts]))

    def parts(self) -> list[GrammarSpec]:
        """An ``any_of``'s specs."""
        return [GrammarSpec(kind, source, any_whitespace) for kind, source, any_whitespace in json.loads(self.source)]
