#!/usr/bin/env bash
# Create or update a venv for the tests: `bash hack/venv.sh` makes .venv (requirements/dev.lock, the engine, the
# operator, the device plugin and the local cluster); `bash hack/venv.sh rngd` makes .venv-rngd
# (requirements/rngd.lock: FuriosaAI's furiosa-torch with the torch it pins, and the engine alone), where the rngd
# backend's compiler runs.
#
# The locked third-party packages (torch alone is ~5 GB) live in a cached venv outside the repo, keyed by the lock
# file and the Python version, and are installed once per machine. The checkout's venv itself is small: it chains
# to that cache with a .pth file and holds only this checkout's own packages (editable), so every clone gets its
# own venv in seconds and a changed lock file builds a new cache entry.
set -euo pipefail
cd "$(dirname "$0")/.."

flavor=${1:-dev}
case "$flavor" in
  dev) venv=.venv; editable=(-e ./engine -e ./operator -e ./deviceplugin -e ./localcluster) ;;
  rngd) venv=.venv-rngd; editable=(-e ./engine) ;;
  *) echo "venv: unknown flavor '$flavor' (dev or rngd)" >&2; exit 2 ;;
esac
lock=requirements/$flavor.lock
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
cache="${ATOM_CACHE_DIR:-$HOME/.cache/atom}/venvs"
key=$( { cat "$lock"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
deps="$cache/$flavor-$key"

# Several checkouts (worktrees, CI beside a session) may build the same entry at once: one builds, the rest wait.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ ! -f "$deps/.complete" ]; then
  echo "venv: installing $lock into $deps (once per machine; torch takes a few minutes)"
  rm -rf "$deps"
  "$python" -m venv "$deps"
  "$deps/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$lock"
  touch "$deps/.complete"
fi
flock -u 9

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.atom-deps" 2>/dev/null)" != "$deps" ]; then
  rm -rf "$venv"
  # No pip or setuptools of its own: those come from the cache too, so the editable build below uses the
  # locked setuptools rather than whatever the interpreter bundles.
  "$python" -m venv --without-pip "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  dep_site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$dep_site')" > "$site/_atom_deps.pth"
  echo "$deps" > "$venv/.atom-deps"
fi

# This checkout's packages, editable; --no-deps because the lock already brought everything they need.
# Editable installs follow code changes by themselves, so they are redone only when packaging changes.
stamp=$(cat engine/pyproject.toml operator/pyproject.toml deviceplugin/pyproject.toml localcluster/pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$venv/.atom-editable" 2>/dev/null)" != "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    "${editable[@]}"
  echo "$stamp" > "$venv/.atom-editable"
fi
