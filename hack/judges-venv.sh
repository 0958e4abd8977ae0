#!/usr/bin/env bash
# Create (once per machine) the venv of the outside judges (requirements/judges.lock: lm-eval, guidellm) and print
# its python; `--lock` regenerates the lock from requirements/judges.in.
exec bash "$(dirname "$0")/pinned-venv.sh" judges "$@"
