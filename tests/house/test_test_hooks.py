"""Test hooks live in tests/ and only tests import them: no product module, harness or benchmark imports from
``tests``, so no hook can end up in a request path (a test installs one into a process itself, as
tests/operator/failpoint.py is)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTSIDE_TESTS = ("engine", "operator", "deviceplugin", "localcluster", "benchmarks", "hack")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def test_nothing_outside_tests_imports_a_test_hook() -> None:
    sources = [p for top in OUTSIDE_TESTS for p in sorted((REPO / top).rglob("*.py")) if ".venv" not in p.parts]
    assert len(sources) > 50  # the scan sees the code it guards
    offenders = [f"{p.relative_to(REPO)}:{line}: {module}" for p in sources
                 for line, module in imported_modules(p) if module == "tests" or module.startswith("tests.")]
    assert not offenders, offenders


def test_the_scan_sees_an_import_of_a_test_hook(tmp_path: Path) -> None:
    """The negative control: the scan does see such an import, in both spellings."""
    source = tmp_path / "x.py"
    source.write_text("import tests.operator.failpoint\nfrom tests.operator import failpoint\nimport testsuite\n")
    modules = [m for _, m in imported_modules(source)]
    assert [m for m in modules if m == "tests" or m.startswith("tests.")] == ["tests.operator.failpoint",
                                                                            "tests.operator"]
