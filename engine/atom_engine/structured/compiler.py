"""Grammars compiled for the served tokenizer: xgrammar's ``TokenizerInfo`` built from the engine's own tokenizer
(a checkpoint's ``tokenizer.json`` or builtin:tiny's bytes), a ``GrammarCompiler``, and an LRU of compiled
grammars keyed by :class:`GrammarSpec` (the same schema sent again is not compiled again). Compiling takes from
microseconds to seconds (a large schema): callers run :meth:`Grammars.compile` off the event loop."""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from itertools import accumulate
from typing import TYPE_CHECKING, Any, TypeVar

from atom_engine.model.tokenizer import ByteTokenizer, HFTokenizer
from atom_engine.structured.constraint import Constraint
from atom_engine.structured.spec import GrammarSpec

if TYPE_CHECKING:
    import xgrammar

    from atom_engine.model.tokenizer import Tokenizer

# xgrammar's time to build a schema's grammar grows steeply with its nesting (a schema nested 1,500 levels keeps
# it busy for minutes), so deeper schemas are refused before it sees them; real ones stay far below.
MAX_SCHEMA_DEPTH = 64  # objects and arrays, one inside another, in a JSON schema
CACHE_ENTRIES = 256  # compiled grammars kept (a JSON-schema grammar of a tool set: tens of KiB to a few MiB)
BOUNDED_STRING_CHAR = r'[^\"\\\r\n]'  # the EBNF text of xgrammar's character class, as printed
JSON_STRING_CHAR = r'[^\0-\x1f\"\\]'  # a character JSON allows unescaped in a string
# xgrammar's C++ errors start with "[time] /path/file.cc:line: "; the rest is the message.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]")
_CXX_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")
T = TypeVar("T")


class GrammarError(ValueError):
    """The grammar source is invalid (a 400 naming the field)."""


class Grammar:
    """A compiled grammar; :meth:`constraint` gives each sequence its own matcher."""

    def __init__(self, compiled: xgrammar.CompiledGrammar, vocab_size: int) -> None:
        self.compiled, self.vocab_size = compiled, vocab_size

    def constraint(self) -> Constraint:
        return Constraint(self.compiled, self.vocab_size)


class Grammars:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_id: int) -> None:
        import xgrammar

        self._xgr = xgrammar
        self.vocab_size = vocab_size
        info = tokenizer_info(tokenizer, vocab_size, eos_token_id)
        # One compile thread: the engine's cores belong to the model; a compile is rarely long.
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[GrammarSpec, Grammar] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled (cache misses), for tests and metrics

    def compile(self, spec: GrammarSpec) -> Grammar:
        """The compiled grammar of ``spec`` (cached); raises :class:`GrammarError` for an invalid source."""
        with self._lock:
            if (hit := self._cache.get(spec)) is not None:
                self._cache.move_to_end(spec)
                return hit
        grammar = Grammar(self._compile(spec), self.vocab_size)
        with self._lock:
            self.compiled += 1
            self._cache[spec] = grammar
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return grammar

    def _compile(self, spec: GrammarSpec) -> xgrammar.CompiledGrammar:
        return _from_xgrammar(self._compiler.compile_grammar, self._grammar(spec))

    def _grammar(self, spec: GrammarSpec) -> xgrammar.Grammar:
        """``spec``'s grammar, not yet compiled for the tokenizer (a :class:`GrammarError` for a bad source)."""
        grammar, xg = self._xgr.Grammar, _from_xgrammar
        if spec.kind == "json_schema":
            if (depth := nesting_depth(spec.source)) > MAX_SCHEMA_DEPTH:
                raise GrammarError(f"the schema is nested {depth} levels deep (objects and arrays); this engine"
                                   f" takes at most {MAX_SCHEMA_DEPTH}")
            return xg(grammar.from_ebnf, self._json_ebnf(spec.source, spec.any_whitespace, strict=True))
        if spec.kind == "json_object":
            if spec.any_whitespace:
                return grammar.builtin_json_grammar()
            return xg(grammar.from_ebnf, self._json_ebnf('{"type": "object"}', False, strict=False))
        if spec.kind == "regex":
            return xg(grammar.from_regex, spec.source)
        if spec.kind == "choice":
            options = json.loads(spec.source)  # ours (GrammarSpec.choice): a failure here is a bug, not a 400
            rule = " | ".join(json.dumps(o) for o in options)  # EBNF string literals use JSON's escapes
            return xg(grammar.from_ebnf, f"root ::= {rule}")
        if spec.kind == "grammar":
            return xg(grammar.from_ebnf, spec.source)
        if spec.kind == "structural_tag":  # text and tagged JSON (tool calls, :mod:`atom_engine.server.tools`)
            ebnf = str(xg(grammar.from_structural_tag, spec.source))
            return xg(grammar.from_ebnf, ebnf.replace(BOUNDED_STRING_CHAR, JSON_STRING_CHAR))
        if spec.kind == "any_of":  # one of several grammars: a tool call or the formatted answer
            return xg(grammar.union, *(self._grammar(part) for part in spec.parts()))
        raise GrammarError(f"unknown grammar kind {spec.kind!r}")

    def _json_ebnf(self, schema: str, any_whitespace: bool, strict: bool) -> str:
        """The schema's grammar as xgrammar writes it, its length-bounded strings mended: xgrammar 0.2.9 writes
        their characters as BOUNDED_STRING_CHAR, which lets raw control characters (U+0000..U+001F) into a
        string, and JSON forbids them (``json.loads`` refuses such output); its unbounded string rule already
        excludes them, as the bounded one now does too."""
        ebnf = str(_from_xgrammar(self._xgr.Grammar.from_json_schema, schema, any_whitespace=any_whitespace,
                                  strict_mode=strict))
        return ebnf.replace(BOUNDED_STRING_CHAR, JSON_STRING_CHAR)


def nesting_depth(text: str) -> int:
    """How deep the objects and arrays of the JSON ``text`` nest (0: a scalar). Read off the brackets outside
    strings, without recursion: the text may be nested deeper than Python's recursion limit."""
    brackets = _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(1 if b in "[{" else -1 for b in brackets), default=0)


def _from_xgrammar(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call`` (one of xgrammar's parse or compile functions), any failure of it a :class:`GrammarError`: it
    reads only the request's source, and besides its checks' RuntimeError and ValueError (a lone surrogate's
    UnicodeEncodeError), its FFI layer raises a C++ error as the Python type of its kind (tvm_ffi/error.py
    ``register_error``: TypeError, KeyError, IndexError, MemoryError, ...). The engine's own steps around these
    calls stay outside, so their bugs stay 500s."""
    try:
        return call(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the source's fault whatever its type (see above)
        text = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)  # KeyError quotes
        message = _CXX_PREFIX.sub("", text).strip()
        raise GrammarError(message or f"xgrammar refused it ({type(exc).__name__})") from None


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int, eos_token_id: int) -> xgrammar.TokenizerInfo:
    """xgrammar's view of the tokenizer: every token's text as the model emits it, and the stop token."""
    import xgrammar

    if isinstance(tokenizer, ByteTokenizer):
        # Bytes 0..255 are themselves; BOS, EOS, PAD and the ids above decode to nothing (special tokens).
        vocab = [bytes([i]) for i in range(256)] + [""] * (vocab_size - 256)
        return xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=vocab_size,
                                      stop_token_ids=[eos_token_id])
    if isinstance(tokenizer, HFTokenizer):
        # What TokenizerInfo.from_huggingface does for a fast tokenizer, from the tokenizers object itself (the
        # pods have no transformers): the vocabulary by id, its encoding detected from the serialized tokenizer.
        backend = tokenizer.backend
        by_id = backend.get_vocab(with_added_tokens=True)
        vocab = [""] * vocab_size
        for token, i in by_id.items():
            if i < vocab_size:
                vocab[i] = token
        meta = xgrammar.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
        return xgrammar.TokenizerInfo(vocab, meta["vocab_type"], vocab_size=vocab_size,
                                      stop_token_ids=[eos_token_id], add_prefix_space=meta["add_prefix_space"])
    raise GrammarError(f"structured outputs: no grammar support for the tokenizer {type(tokenizer).__name__}")
