"""Tokenizers: a checkpoint's ``tokenizer.json`` through ``tokenizers``, and a byte-level one for builtin:tiny."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    eos_token_id: int | None
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """Token i < 256 is byte i; then BOS, EOS and PAD; ids above decode to nothing."""

    BOS, EOS, PAD = 256, 257, 258

    def __init__(self, vocab_size: int = 320) -> None:
        if vocab_size < 259:
            raise ValueError(f"a byte tokenizer needs vocab_size >= 259 (256 bytes + BOS, EOS, PAD); got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_token_id: int | None = self.EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:  # noqa: ARG002 (it adds none)
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A checkpoint's ``tokenizer.json`` (the fast-tokenizer file every recent HF checkpoint ships)."""

    def __init__(self, path: Path, eos_token_id: int | None) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        self._tok = _Tokenizer.from_file(str(path))
        self.backend = self._tok  # the tokenizers object itself (the grammar engine reads its vocabulary)
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_token_id = eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``add_special_tokens``: what the tokenizer's post-processor adds (a BOS, say); a rendered chat template
        already holds its special tokens, so chat prompts are encoded without (as HF and vLLM do)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)
