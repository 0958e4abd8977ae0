#!/usr/bin/env bash
# Create (once per machine) the venv of the outside judges (lm-eval, guidellm) and print its python.
#
# The judges pin packages differently from the dev lock (httpx, setuptools, ...), so they get their own venv,
# cached outside the repo and keyed by requirements/judges.lock and the dev venv it chains to. Chaining (a .pth
# file, as hack/venv.sh does for .venv) reuses the dev cache's torch and transformers instead of a second
# multi-GB install; the judges' own packages sit in the venv itself and so come first on sys.path.
set -euo pipefail
cd "$(dirname "$0")/.."

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
  # requirements/judges.lock: what pip adds to the dev venv to install judges.in (a dry run: nothing installed).
  tmp=$(mktemp -d)
  "$python" -m venv --without-pip "$tmp/venv"
  chain "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check --dry-run --report "$tmp/report.json" \
    -r requirements/judges.in >&2
  { echo "# Generated from requirements/judges.in: pip's resolution of it on top of the dev venv (dev.lock), so only the"
    echo "# packages the dev lock lacks or pins differently are here. Installed by hack/judges-venv.sh (--no-deps)."
    "$python" -c 'import json, sys
meta = [i["metadata"] for i in json.load(open(sys.argv[1]))["install"]]
print("\n".join(sorted((m["name"] + "==" + m["version"] for m in meta), key=str.lower)))' \
      "$tmp/report.json"; } > requirements/judges.lock
  rm -rf "$tmp"
  exit 0
fi
cache="${ATOM_CACHE_DIR:-$HOME/.cache/atom}/venvs"
key=$( { cat requirements/judges.lock; echo "$deps"; } | sha256sum | cut -c1-16)
judges="$cache/judges-$key"

mkdir -p "$cache"
exec 9>"$cache/.judges.lock"
flock 9  # one build of an entry at a time; the others wait and reuse it
if [ ! -f "$judges/.complete" ]; then
  echo "judges-venv: installing lm-eval and guidellm into $judges (once per machine)" >&2
  rm -rf "$judges"
  "$python" -m venv --without-pip "$judges"
  chain "$judges"
  "$judges/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/judges.lock >&2
  touch "$judges/.complete"
fi
flock -u 9
echo "$judges/bin/python"
