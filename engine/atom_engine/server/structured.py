"""Structured outputs for the routes: a request's grammar fields to a :class:`GrammarSpec` (a 400 naming the
field), and the spec compiled (off the event loop, cached) onto its sampling parameters.

The fields: OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema``), vLLM's
``structured_outputs`` (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``, ``disable_any_whitespace``)
and vLLM's older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``. At most one grammar
per request.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from atom_engine.sequence import SamplingParams
from atom_engine.server.error_responses import ApiError
from atom_engine.structured.spec import GrammarSpec

if TYPE_CHECKING:
    from atom_engine.engine import LLMEngine
    from atom_engine.structured.compiler import Grammars

STRUCTURED_KEYS = {"json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace",
                   "disable_fallback", "disable_additional_properties"}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def _schema(value: Any, where: str, param: str) -> dict[str, Any] | bool:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise _bad(param, f"{where}: not valid JSON: {exc}") from None
        except RecursionError:  # json's decoder recurses once per nested array or object
            raise _bad(param, f"{where}: nested too deep to parse") from None
    if not isinstance(value, dict | bool):
        raise _bad(param, f"{where}: a JSON schema is an object; got {type(value).__name__}")
    return value


def _choice(value: Any, where: str, param: str) -> GrammarSpec:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _bad(param, f"{where}: a non-empty list of strings")
    return GrammarSpec.choice(value)


def _text(value: Any, where: str, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(param, f"{where}: a non-empty string")
    return value


def spec_of(fields: dict[str, Any]) -> tuple[str, GrammarSpec] | None:
    """The grammar a request's fields ask for and the field that asked (None: free text). ``fields``: the
    request's top-level fields."""
    found: list[tuple[str, GrammarSpec]] = []
    rf = fields.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_object":
            found.append(("response_format", GrammarSpec("json_object")))
        elif kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or "schema" not in js:
                raise _bad("response_format", "response_format.json_schema: needs {'name': ..., 'schema': {...}}")
            found.append(("response_format", GrammarSpec.json_schema(
                _schema(js["schema"], "response_format.json_schema.schema", "response_format"))))
        elif kind != "text":
            raise _bad("response_format", f"response_format.type: one of 'text', 'json_object', 'json_schema';"
                       f" got {kind!r}")
    so = fields.get("structured_outputs")
    whitespace = False
    if so is not None:
        if not isinstance(so, dict):
            raise _bad("structured_outputs", "structured_outputs: an object")
        unknown = sorted(set(so) - STRUCTURED_KEYS)
        if unknown:
            raise _bad("structured_outputs", f"structured_outputs: {unknown} not supported by this engine; it takes"
                       f" {sorted(STRUCTURED_KEYS)}")
        whitespace = so.get("disable_any_whitespace") is False
        where = "structured_outputs"
        if so.get("json") is not None:
            found.append((where, GrammarSpec.json_schema(_schema(so["json"], f"{where}.json", where), whitespace)))
        if so.get("regex") is not None:
            found.append((where, GrammarSpec("regex", _text(so["regex"], f"{where}.regex", where))))
        if so.get("choice") is not None:
            found.append((where, _choice(so["choice"], f"{where}.choice", where)))
        if so.get("grammar") is not None:
            found.append((where, GrammarSpec("grammar", _text(so["grammar"], f"{where}.grammar", where))))
        if so.get("json_object"):
            found.append((where, GrammarSpec("json_object", any_whitespace=whitespace)))
    for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"):
        value = fields.get(name)
        if value is None:
            continue
        if name == "guided_json":
            found.append((name, GrammarSpec.json_schema(_schema(value, name, name))))
        elif name == "guided_choice":
            found.append((name, _choice(value, name, name)))
        else:
            found.append((name, GrammarSpec(name.removeprefix("guided_"), _text(value, name, name))))  # type: ignore[arg-type]
    if len(found) > 1:
        raise _bad(found[1][0], f"structured outputs: one grammar per request; got {[n for n, _ in found]}")
    if not found:
        return None
    param, spec = found[0]
    if fields.get("ignore_eos"):
        raise _bad("ignore_eos", f"ignore_eos: not with {param} (the output ends where the grammar does)")
    if fields.get("min_tokens"):
        raise _bad("min_tokens", f"min_tokens: not with {param} (the grammar may end the output before)")
    return param, spec


class StructuredOutputs:
    """The server's grammar compiler, built on first use (the tokenizer's vocabulary is read once)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._grammars: Grammars | None = None
        self._lock = asyncio.Lock()

    async def apply(self, asked: tuple[str, GrammarSpec] | None, params: SamplingParams) -> SamplingParams:
        """``params`` with the compiled grammar of ``asked`` (the field and its spec; compiled in a worker
        thread); a 400 naming the field for an invalid one."""
        if asked is None:
            return params
        param, spec = asked
        from atom_engine.structured.compiler import GrammarError

        grammars = await self._compiler(param)
        try:
            grammar = await asyncio.to_thread(grammars.compile, spec)
        except GrammarError as exc:
            raise _bad(param, f"{param}: invalid {spec.kind.replace('_', ' ')}: {exc}") from None
        return replace(params, grammar=grammar)

    async def _compiler(self, param: str) -> Grammars:
        async with self._lock:
            if self._grammars is None:
                from atom_engine.structured.compiler import Grammars

                e = self.engine
                if e.tokenizer is None or e.eos_token_id is None:
                    raise _bad(param, f"{param}: structured outputs need the model's tokenizer and EOS token;"
                               f" {e.settings.model_source} lacks them")
                self._grammars = await asyncio.to_thread(Grammars, e.tokenizer, e.vocab_size, e.eos_token_id)
            return self._grammars
