#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are not installed yet, with apt-get:
# as root directly, otherwise through sudo (non-interactive). Prints nothing when all are present.
#
#   bash hack/debian-packages.sh mmdebstrap buildah skopeo
#
# The image build (hack/image.sh) and the local control plane's container runtime (runc) use it, so a
# fresh Debian machine or CI gets them from the project's own scripts.
set -euo pipefail
missing=()
for package in "$@"; do
  status=$(dpkg-query --show --showformat='${db:Status-Status}' "$package" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "hack/debian-packages.sh: missing Debian packages ${missing[*]}: run as root, or give this user" \
    "password-less sudo, or install them: apt-get install ${missing[*]}" >&2
  exit 1
fi
command -v apt-get >/dev/null || {
  echo "hack/debian-packages.sh: no apt-get on this machine; install ${missing[*]} with its package manager" >&2
  exit 1
}
echo "[debian-packages] installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# `make demo` installs the image build's packages and runc at the same time (hack/image.sh and
# testbed/cluster/build.sh run in parallel): the second apt-get waits for the first one's dpkg lock
# instead of failing on it.
apt_get=("${as_root[@]}" apt-get -o DPkg::Lock::Timeout=600)
# A stale package list names versions the mirror no longer has: refresh it once and retry.
"${apt_get[@]}" install --yes --no-install-recommends "${missing[@]}" >&2 \
  || { "${apt_get[@]}" update >&2 && "${apt_get[@]}" install --yes --no-install-recommends "${missing[@]}" >&2; }
