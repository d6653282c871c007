#!/usr/bin/env bash
# Measures what CI (or another command) costs on a machine with nothing cached: a fresh clone of
# HEAD, and empty Go module/build caches, pip and npm caches and shardops cache (all under one temp
# dir, so the real caches of this machine are neither used nor touched). Prints the wall time.
#   bash hack/cold-ci.sh                     # cold CI: `bash .ci/run`
#   WARM=1 bash hack/cold-ci.sh              # fresh clone, but the machine's own caches (a warm CI run)
#   bash hack/cold-ci.sh 'make demo && make cluster-down'   # a newcomer's first `make demo`, cold
#   WARM_GO_MODULES=1 bash hack/cold-ci.sh ...   # cold, but the machine's Go module cache (no downloads)
# The Debian packages (hack/debian-packages.sh) stay as installed on this machine.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
command=${1:-CI=true bash .ci/run}
work=$(mktemp -d /tmp/shardops-ci-XXXXXX)
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone"
if [ -z "${WARM:-}" ]; then
  GOMODCACHE=${WARM_GO_MODULES:+$(go env GOMODCACHE)}
  export GOMODCACHE="${GOMODCACHE:-$work/cache/go-mod}" GOCACHE="$work/cache/go-build" GOPATH="$work/cache/go"
  export PIP_CACHE_DIR="$work/cache/pip" npm_config_cache="$work/cache/npm"
  export SHARDOPS_CACHE="$work/cache/shardops"
fi
start=$(date +%s)
(cd "$work/clone" && bash -c "$command")
if [ -n "${WARM:-}" ]; then kind=warm; else kind=cold${WARM_GO_MODULES:+ (Go module cache warm)}; fi
echo "wall time of \`$command\`: $(( $(date +%s) - start ))s ($kind)"
