#!/usr/bin/env bash
# Measures what CI costs on a machine with nothing cached: a fresh clone of HEAD, and empty
# Go module/build caches, pip and npm caches and shardops cache (all under one temp dir, so
# the real caches of this machine are neither used nor touched). Prints the wall time.
#   bash hack/cold-ci.sh            # cold
#   WARM=1 bash hack/cold-ci.sh     # fresh clone, but the machine's own caches (a warm CI run)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/shardops-ci-XXXXXX)
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone"
if [ -z "${WARM:-}" ]; then
  export GOMODCACHE="$work/cache/go-mod" GOCACHE="$work/cache/go-build" GOPATH="$work/cache/go"
  export PIP_CACHE_DIR="$work/cache/pip" npm_config_cache="$work/cache/npm"
  export SHARDOPS_CACHE="$work/cache/shardops"
fi
start=$(date +%s)
(cd "$work/clone" && CI=true bash .ci/run)
if [ -n "${WARM:-}" ]; then kind=warm; else kind=cold; fi
echo "ci wall time: $(( $(date +%s) - start ))s ($kind)"
