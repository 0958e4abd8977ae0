"""The HTTP layer knows a request by its immutable outputs only: no server module imports the engine thread's
``Sequence`` (or its status) or the batcher, or reaches into the engine's batcher."""

from __future__ import annotations

import ast
from pathlib import Path

import atom_engine.server

SERVER = Path(atom_engine.server.__file__).parent
# What the server may take from atom_engine.sequence: request parameters and the per-step outputs.
ALLOWED_FROM_SEQUENCE = {"SamplingParams", "StepOutput", "FinishReason", "TokenLogprob", "MAX_LOGPROBS"}
FORBIDDEN_MODULES = {"atom_engine.batcher", "atom_engine.plan_executor", "atom_engine.step_plan"}
FORBIDDEN_ATTRIBUTES = {"batcher"}  # engine.batcher: the engine's private scheduler


def offences(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "atom_engine.sequence":
            found += [f"imports {a.name} from atom_engine.sequence" for a in node.names
                      if a.name not in ALLOWED_FROM_SEQUENCE]
        elif isinstance(node, ast.ImportFrom) and node.module in FORBIDDEN_MODULES:
            found.append(f"imports from {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if a.name in FORBIDDEN_MODULES]
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append(f"reads .{node.attr}")
    return found


def test_no_server_module_imports_sequence_internals_or_the_batcher() -> None:
    modules = sorted(SERVER.glob("*.py"))
    assert len(modules) > 5  # the package is where it is said to be
    bad = {m.name: found for m in modules if (found := offences(m.read_text()))}
    assert bad == {}


def test_the_check_sees_an_offence() -> None:
    assert offences("from atom_engine.sequence import Sequence, StepOutput\nx = engine.batcher.counters\n") == [
        "imports Sequence from atom_engine.sequence", "reads .batcher"]
    assert offences("import atom_engine.batcher\n") == ["imports atom_engine.batcher"]
