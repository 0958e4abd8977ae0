"""Every command the README shows is run by some test tier, or is listed here as not runnable on this machine with
the reason; a command added to the README that is neither fails this test, and so does a listed test that is gone.

A command is a logical line of a ```bash block (continuations joined, comments dropped); each is matched by exactly
one entry of :data:`COMMANDS`: a regular expression and either the test that runs it (``path::test``, or
``.ci/run`` for what CI itself runs) or ``NOT_RUNNABLE`` with why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_RUNNABLE = "not runnable here"
EXAMPLES_TEST = "tests/operator/test_examples.py::test_kubectl_apply_of_an_example_becomes_ready"

COMMANDS: dict[str, tuple[str, str]] = {
    r"make demo": ("tests/cluster/test_demo.py::test_make_demo_answers_gives_a_structured_answer_and_calls_a_tool",
                   "the command itself, checked to its last step"),
    r"make test": (".ci/run", "CI runs it from a fresh clone"),
    r"make test-fast": ("tests/house/test_readme_commands.py::test_make_test_fast_is_a_subset_of_make_test",
                        "its tests are a marker-filtered subset of make test's, which CI runs"),
    r"\.venv/bin/python -m pytest tests/operator/test_reconciler\.py -x": (
        ".ci/run", "make test runs that file with the rest of the suite"),
    r"make docker-build": ("tests/images/test_images.py::test_an_engine_image_installs_exactly_its_lock",
                           "the image tier builds the same targets through atom_localcluster.docker, as the"
                           " make target does"),
    r"REGISTRY=\S+": (NOT_RUNNABLE, "no registry that a cluster pulls from runs here; the tiers load images"
                                    " into the node's containerd (real node) or with kind load"),
    r"for image in .*; do": (NOT_RUNNABLE, "the push loop needs that registry"),
    r"docker tag .* && docker push .*": (NOT_RUNNABLE, "the push loop needs that registry"),
    r"done": (NOT_RUNNABLE, "the push loop needs that registry"),
    r"helm install atom-operator charts/atom-operator .*": (
        "tests/realnode/test_e2e.py::test_ready_with_pods_on_the_real_node",
        "helm install of the chart with the images' --set values (pull policy Never: the images are on the node)"),
    r"kubectl apply -f examples/\S+\.yaml": (EXAMPLES_TEST, "every example, applied with kubectl, becomes READY"),
    r"kubectl get atomdeployments -w": (EXAMPLES_TEST, "the printer columns read without -w (a watch never ends)"),
    r"kubectl port-forward service/tiny 8000:8000": ("tests/realnode/test_e2e.py::test_chat_completion",
                                                     "a port-forward to service/tiny's port 8000"),
    r"curl http://127\.0\.0\.1:8000/v1/chat/completions .*": (
        "tests/realnode/test_e2e.py::test_chat_completion", "the same chat completion, through the openai client"),
}


def readme_commands(text: str) -> list[str]:
    """The logical lines of the README's bash blocks, without comments."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"(^|\s+)#.*$", "", line).strip()  # no README command has a '#' inside quotes
            if line:
                commands.append(line)
    return commands


def entry(command: str) -> str:
    matches = [pattern for pattern in COMMANDS if re.fullmatch(pattern, command)]
    assert len(matches) == 1, f"README command {command!r} matches {matches or 'no entry'} of COMMANDS: run it in" \
                              " a test tier and name that test here, or list it as not runnable with the reason"
    return matches[0]


def test_every_readme_command_is_run_by_a_tier_or_listed_as_not_runnable() -> None:
    commands = readme_commands((REPO / "README.md").read_text())
    assert len(commands) >= 10, commands  # the parser found the blocks
    used = {entry(c) for c in commands}
    assert used == set(COMMANDS), f"entries no README command uses any more: {set(COMMANDS) - used}"


def test_every_named_test_exists() -> None:
    for where, why in COMMANDS.values():
        assert why, where
        if where == NOT_RUNNABLE:
            continue
        if where == ".ci/run":
            assert "make test " in (REPO / ".ci/run").read_text()
            continue
        path, _, name = where.partition("::")
        tree = ast.parse((REPO / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert name in names, f"{where}: no such test"


def test_make_test_fast_is_a_subset_of_make_test() -> None:
    """test-fast's paths are under the suite make test runs (testpaths), and its marker filter only narrows."""
    makefile = (REPO / "Makefile").read_text()
    fast = re.search(r"^test-fast:.*\n\t\$\(PY\) -m pytest -m \"([^\"]+)\" (.+?) \$\(PYTEST_ARGS\)", makefile, re.M)
    assert fast, "the test-fast recipe changed shape: update this test"
    marker, paths = fast.group(1), fast.group(2).split()
    assert all(p.startswith("tests/") for p in paths), paths
    assert marker.startswith("not ") and " or " not in marker, marker
    full = re.search(r"^test:.*\n(\t.*\n)+", makefile, re.M).group(0)
    assert "\t$(PY) -m pytest $(PYTEST_ARGS)\n" in full, full
