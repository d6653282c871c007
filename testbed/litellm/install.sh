#!/usr/bin/env bash
# Installs (once) the LiteLLM proxy pinned in versions.env beside this file into a venv of its own:
#   ~/.cache/shardops/litellm-<LITELLM_VERSION>/bin/litellm
# with the requirements of its proxy (proxy-requirements.txt, which says why not `litellm[proxy]`),
# and prints that bin directory on its last line. A stamp named after the hash of the pins and the
# Python it was made with makes a warm run cost nothing; a pin change installs anew.
# `install.sh --check` installs nothing: it prints the directory when installed at the pin, else says
# so and exits 1.
# Needs PyPI: where pip cannot reach it, this fails naming pip's error, and e2e/test_litellm.py
# skips with it (fails under CI=true).
set -euo pipefail
check_only=false
case "${1:-}" in
  --check) check_only=true ;;
  "") ;;
  *) echo "usage: install.sh [--check]" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source "$here/versions.env"
python=${PYTHON:-python3}
cache_root=${SHARDOPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardops}
venv="$cache_root/litellm-$LITELLM_VERSION"
inputs_hash=$( { cat "$here/versions.env" "$here/proxy-requirements.txt"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
stamp="$venv/.installed-$inputs_hash"
if [ -e "$stamp" ]; then echo "$venv/bin"; exit 0; fi
if $check_only; then
  echo "LiteLLM $LITELLM_VERSION is not installed in $venv (run: bash testbed/litellm/install.sh)" >&2
  exit 1
fi
mkdir -p "$cache_root"
# One install at a time: two e2e sessions (make e2e's xdist workers, or two checkouts) may ask at once;
# the second waits here and finds the stamp.
exec 9>"$cache_root/.litellm-install.lock"
flock 9
if [ -e "$stamp" ]; then echo "$venv/bin"; exit 0; fi
start=$(date +%s)
echo "[litellm] installing litellm==$LITELLM_VERSION and its proxy's requirements into $venv (cold: minutes)" >&2
# A venv holds absolute paths, so it is made in place; a failed install leaves no stamp and is redone.
rm -rf "$venv"
"$python" -m venv "$venv"
# Two tries of 15 s each: without PyPI this fails in under a minute instead of pip's default ~5.
"$venv/bin/pip" install --quiet --disable-pip-version-check --retries 1 --timeout 15 \
  "litellm==$LITELLM_VERSION" -r "$here/proxy-requirements.txt" >&2
touch "$stamp"
echo "[litellm] installed in $(( $(date +%s) - start ))s" >&2
echo "$venv/bin"
