#!/usr/bin/env bash
# Create (once per machine) the agent frameworks' venvs and print their pythons, one a line: `agents`
# (requirements/agents.lock: openai-agents, pydantic-ai, langchain-openai) then `instructor`
# (requirements/instructor.lock: its pins exclude the openai the others need). `--lock` regenerates both locks
# from their .in files.
set -euo pipefail
for name in agents instructor; do
  bash "$(dirname "$0")/pinned-venv.sh" "$name" "$@"
done
