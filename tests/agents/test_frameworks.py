"""Agent frameworks' normal call paths, each through the framework itself (tests/agents/driver.py in the
frameworks' pinned venvs), against a real engine serving SmolLM2-135M-Instruct.

A pass is what the framework's user sees work: the framework's call completed (no error, no give-up after its
turn limit), what it parsed validates as the output type, and where the agent has a tool to learn the answer from,
the tool ran. The table of these cases, with the frameworks' versions, is docs/api.md's "Agent frameworks".

Sampling is greedy, except where an agent's answer must follow a call under ``tool_choice: auto`` with an output
format. There the engine samples the union of a call and the formatted answer, and SmolLM2-135M starts a call on
nearly every sample at every turn, whatever the history (before any call, or after the call and its result): run
greedily such an agent never ends. Those cases sample at temperature 1, seeded (``ATOM_AGENT_SEEDS``,
comma-separated; default one seed), with a logit bias of ``CALL_BIAS`` on a call's first token, sent through the
framework's own settings, so that the answer branch is taken within a few turns. A forced turn is calls only
whatever the bias, so where the agent forces its first call the tool must have run; under ``auto`` the model may
answer at once (whether it called is reported, not required). The figures are in docs/api.md.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents.conftest import offline_env
from tests.serving.conftest import REPO, Proc

pytestmark = pytest.mark.agents
DRIVER = Path(__file__).parent / "driver.py"
CALL_BIAS = -4.0
SEEDS = tuple(int(s) for s in os.environ.get("ATOM_AGENT_SEEDS", "1").split(","))


@dataclass(frozen=True)
class Case:
    name: str  # a function of driver.py
    venv: str = "agents"  # which of hack/agents-venv.sh's venvs runs it
    parsed: bool = True  # the output must validate as driver.Weather
    tool: bool = False  # get_weather must have run
    partials: int = 0  # at least this many partial objects streamed
    union: bool = False  # the answer follows a call under auto with a format: sampled, biased (module docstring)


CASES = [
    Case("openai_agents_responses_required", tool=True, union=True),
    Case("openai_agents_responses_auto", union=True),
    Case("openai_agents_chat_required", tool=True, union=True),
    Case("openai_agents_chat_auto", union=True),
    Case("pydantic_ai_tool_output"),
    Case("pydantic_ai_native_output", union=True),
    Case("langchain_structured_output"),
    Case("langchain_structured_output_function_calling"),
    Case("langchain_bind_tools", parsed=False, tool=True),
    Case("instructor_tools", venv="instructor"),
    Case("instructor_json_schema", venv="instructor"),
    Case("instructor_responses_tools", venv="instructor"),
    Case("instructor_create_partial", venv="instructor", partials=3),
]


def drive(python: Path, case: Case, engine: Proc, seed: int, tmp: Path) -> dict:
    sampling = ["1.0", str(seed), str(CALL_BIAS)] if case.union else ["0", str(seed), "0"]
    command = [str(python), str(DRIVER), case.name, engine.url, *sampling]
    run = subprocess.run(command, cwd=REPO, env=offline_env(tmp),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


RUNS = [(case, seed) for case in CASES for seed in (SEEDS if case.union else SEEDS[:1])]  # greedy: one run


@pytest.mark.parametrize(("case", "seed"), RUNS, ids=[f"{c.name}-{s}" if c.union else c.name for c, s in RUNS])
def test_the_frameworks_call_completes_validates_and_runs_its_tool(
        framework_pythons: dict[str, Path], engine: Proc, tmp_path: Path, case: Case, seed: int) -> None:
    outcome = drive(framework_pythons[case.venv], case, engine, seed, tmp_path)
    assert outcome["completed"], outcome.get("traceback", outcome)
    if case.parsed:
        assert outcome["valid"], outcome
    else:
        assert isinstance(outcome["output"], str) and outcome["output"].strip(), outcome
    if case.tool:
        assert outcome["tool_runs"], outcome
    assert outcome["partials"] >= case.partials, outcome
