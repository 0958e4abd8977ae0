#!/usr/bin/env bash
# Create (once per machine) the venv of a set of outside clients and print its python:
# `hack/pinned-venv.sh NAME` installs requirements/NAME.lock; `hack/pinned-venv.sh NAME --lock` writes it from
# requirements/NAME.in. The judges (lm-eval, guidellm: hack/judges-venv.sh) and the agent frameworks
# (openai-agents, pydantic-ai, instructor, langchain-openai: hack/agents-venv.sh) are such sets.
#
# Such clients pin packages differently from the dev lock (httpx, setuptools, ...), so each set gets its own venv,
# cached outside the repo and keyed by its lock and the dev venv it chains to. Chaining (a .pth file, as
# hack/venv.sh does for .venv) reuses the dev cache's torch and transformers instead of a second multi-GB install;
# the set's own packages sit in the venv itself and so come first on sys.path. The tests run offline: everything
# is installed here, before them.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
shift

bash hack/venv.sh >&2
deps=$(cat .venv/.atom-deps)
python="$deps/bin/python"

chain() {  # make venv $1 see the dev cache's packages after its own
  local site dep_site
  site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  dep_site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$dep_site')" > "$site/_atom_deps.pth"
}

if [ "${1:-}" = "--lock" ]; then
  # requirements/NAME.lock: what pip adds to the dev venv to install NAME.in (a dry run: nothing installed).
  tmp=$(mktemp -d)
  "$python" -m venv --without-pip "$tmp/venv"
  chain "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check --dry-run --report "$tmp/report.json" \
    -r "requirements/$name.in" >&2
  { echo "# Generated from requirements/$name.in: pip's resolution of it on top of the dev venv (dev.lock), so only the"
    echo "# packages the dev lock lacks or pins differently are here. Installed by hack/pinned-venv.sh (--no-deps)."
    "$python" -c 'import json, sys
meta = [i["metadata"] for i in json.load(open(sys.argv[1]))["install"]]
print("\n".join(sorted((m["name"] + "==" + m["version"] for m in meta), key=str.lower)))' \
      "$tmp/report.json"; } > "requirements/$name.lock"
  rm -rf "$tmp"
  exit 0
fi
cache="${ATOM_CACHE_DIR:-$HOME/.cache/atom}/venvs"
key=$( { cat "requirements/$name.lock"; echo "$deps"; } | sha256sum | cut -c1-16)
venv="$cache/$name-$key"

mkdir -p "$cache"
exec 9>"$cache/.$name.lock"
flock 9  # one build of an entry at a time; the others wait and reuse it
if [ ! -f "$venv/.complete" ]; then
  echo "$name-venv: installing requirements/$name.lock into $venv (once per machine)" >&2
  rm -rf "$venv"
  "$python" -m venv --without-pip "$venv"
  chain "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "requirements/$name.lock" >&2
  touch "$venv/.complete"
fi
flock -u 9
echo "$venv/bin/python"
