#!/usr/bin/env bash
# `make image`: the shardops image without Docker and without a base image from a registry.
#
#   bash hack/image.sh            # dist/shardops-image.oci.tar; prints its manifest digest last
#   IMAGE_REBUILD=1 bash hack/image.sh   # rebuild even when the inputs did not change
#
# 1. wheels of shardops and of every dependency, at the versions of constraints.txt, by pip from
#    PyPI (into ~/.cache/shardops/image/wheels; pip's own cache makes a rebuild fast);
# 2. a Debian rootfs by mmdebstrap from Debian's packages (variant minbase, as debian:bookworm-slim;
#    Python from Debian: package python3),
#    with a virtualenv /opt/shardops holding shardops, installed from those wheels only
#    (no network inside the rootfs), pip removed afterwards, bytecode compiled at install time;
# 3. buildah commits it (STORAGE_DRIVER=vfs, BUILDAH_ISOLATION=chroot, storage under the cache) as
#    an OCI archive with the image config below: user 65532:65532, ENTRYPOINT ["shardops"],
#    CMD ["operator"], WORKDIR /tmp, the Dockerfile's ENV and labels.
#
# The Dockerfile builds the same content for users with Docker (tests/image/test_build.py keeps the
# two in step). The archive is cached: the hash of every input (this script, pyproject.toml,
# constraints.txt, README.md, LICENSE, operator/, examples/, the Debian suite and packages) is stored
# next to it, and a build whose inputs hash matches prints the digest and stops; a copy is kept under
# ~/.cache/shardops/image/archives/<hash>, so a fresh clone of the same sources copies it (~1 s).
#
# Debian packages it needs (mmdebstrap, buildah, skopeo, uidmap) are installed by
# hack/debian-packages.sh with apt-get.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
cache_root=${SHARDOPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardops}
cache="$cache_root/image"
dist="$repo/dist"
archive="$dist/shardops-image.oci.tar"
stamp="$dist/shardops-image.inputs"
digest_file="$dist/shardops-image.digest"
log() { echo "[image] ${start:+$(( $(date +%s) - start ))s: }$*" >&2; }

# --- what the image is (the Dockerfile says the same; tests/image/test_build.py compares them) ---
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
# The name the archive carries: the chart's default image.repository at the chart's appVersion, so
# `helm install` of the chart runs this image wherever the archive is loaded.
image_name="ghcr.io/shardops/shardops:$version"
suite=bookworm
# minbase: Essential and Priority:required packages and apt, the package set debian:<suite>-slim
# (the Dockerfile's base) is made of, so images built on top can apt-get install.
variant=minbase
mirror=http://deb.debian.org/debian
security_mirror=http://deb.debian.org/debian-security
runtime_packages=python3,ca-certificates
build_packages=python3-venv
# What python3-venv brings only to build the venv; purged before the commit, as pip is.
build_only="python3-venv python3.11-venv python3-pip-whl python3-setuptools-whl"
image_user=65532:65532
# The user has a name too: Python's getpass.getuser() (kopf's peering identity) looks it up.
passwd_entry="shardops:x:65532:65532:shardops:/tmp:/usr/sbin/nologin"
group_entry="shardops:x:65532:"
image_workdir=/tmp
venv=/opt/shardops

inputs_hash=$(
  {
    cat hack/image.sh pyproject.toml constraints.txt README.md LICENSE
    echo "$passwd_entry $group_entry"
    echo "$image_name $suite $variant $mirror $security_mirror $runtime_packages $build_packages"
    find operator examples -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 \
      | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-32
)
if [ -z "${IMAGE_REBUILD:-}" ] && [ -s "$archive" ] && [ -s "$digest_file" ] \
  && [ "$(cat "$stamp" 2>/dev/null)" = "$inputs_hash" ]; then
  log "up to date ($archive, inputs $inputs_hash)"
  cat "$digest_file"
  exit 0
fi
# Archives are also kept in the cache by input hash, so a fresh clone (CI, another worktree) of the
# same sources gets the image without building it.
cached="$cache/archives/$inputs_hash"
if [ -z "${IMAGE_REBUILD:-}" ] && [ -s "$cached.oci.tar" ] && [ -s "$cached.digest" ]; then
  mkdir -p "$dist"
  cp -f "$cached.oci.tar" "$archive.tmp" && mv -f "$archive.tmp" "$archive"
  cp -f "$cached.digest" "$digest_file"
  echo "$inputs_hash" >"$stamp"
  touch "$cached.oci.tar"
  log "from the cache ($cached.oci.tar)"
  cat "$digest_file"
  exit 0
fi

bash hack/debian-packages.sh mmdebstrap buildah skopeo uidmap
start=$(date +%s)
mkdir -p "$cache" "$dist"
work=$(mktemp -d "$cache/build.XXXXXX")
container=""
cleanup() {
  if [ -n "$container" ]; then buildah "${buildah_store[@]}" rm "$container" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# 1. wheels, from PyPI through pip (not from a machine-local wheel directory).
log "wheels for shardops $version (pip, constraints.txt)"
wheels="$work/wheels"
mkdir -p "$wheels"
# From a copy of the sources: setuptools writes build/ and *.egg-info into the tree it builds, and
# `make demo` builds the venv's editable install from the checkout at the same time.
source="$work/source"
mkdir -p "$source"
tar -c --exclude=__pycache__ --exclude='*.egg-info' pyproject.toml README.md LICENSE operator examples/agent \
  | tar -x -C "$source"
env -u PIP_FIND_LINKS -u PIP_NO_INDEX -u PIP_INDEX_URL python3 -m pip wheel --quiet --disable-pip-version-check \
  --constraint constraints.txt --wheel-dir "$wheels" "$source" >&2
cp constraints.txt "$wheels/constraints.txt"

# Commands inside the rootfs get a clean environment: none of this machine's pip or Python settings.
in_rootfs="env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8"

# 2. the rootfs. Debian packages are kept between builds in the cache (apt's archive directory is
# synced in and out), so a rebuild after a code change downloads nothing from Debian.
debs="$cache/debs"
mkdir -p "$debs"
log "Debian $suite rootfs (mmdebstrap: $runtime_packages)"
nice mmdebstrap --quiet --variant="$variant" --include="$runtime_packages,$build_packages" \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --skip=essential/unlink \
  --setup-hook='mkdir -p "$1/var/cache/apt/archives"' \
  --setup-hook="sync-in '$debs' /var/cache/apt/archives" \
  --customize-hook="sync-out /var/cache/apt/archives '$debs'" \
  --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
  --customize-hook="echo '$passwd_entry' >>\"\$1/etc/passwd\" && echo '$group_entry' >>\"\$1/etc/group\"" \
  --customize-hook="copy-in '$wheels' /" \
  --customize-hook="chroot \"\$1\" $in_rootfs python3 -m venv $venv" \
  --customize-hook="chroot \"\$1\" $in_rootfs $venv/bin/pip install --quiet --no-index --find-links /wheels --constraint /wheels/constraints.txt shardops" \
  --customize-hook="chroot \"\$1\" $in_rootfs $venv/bin/shardops --help >/dev/null" \
  --customize-hook="chroot \"\$1\" $in_rootfs $venv/bin/pip uninstall --quiet --yes pip" \
  --customize-hook="chroot \"\$1\" $in_rootfs dpkg --purge $build_only >/dev/null" \
  --customize-hook='rm -rf "$1/wheels" "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log "$1"/root/.cache' \
  "$suite" "$work/rootfs.tar" \
  "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security_mirror $suite-security main" >&2

# 3. the image: one layer (the rootfs), the config, an OCI archive.
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
buildah_store=(--root "$cache/containers/storage" --runroot "$cache/containers/run")
log "committing $image_name (buildah, vfs)"
container=$(buildah "${buildah_store[@]}" from --quiet scratch)
buildah "${buildah_store[@]}" add --quiet "$container" "$work/rootfs.tar" / >/dev/null
buildah "${buildah_store[@]}" config \
  --user "$image_user" \
  --workingdir "$image_workdir" \
  --entrypoint '["shardops"]' \
  --cmd '["operator"]' \
  --env "PATH=$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --env PYTHONDONTWRITEBYTECODE=1 \
  --env PYTHONUNBUFFERED=1 \
  --label org.opencontainers.image.title=shardops \
  --label "org.opencontainers.image.description=shardops operator and worker runtime: campaigns of long, flaky work as leased, heartbeated, idempotent shards" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  "$container"
rm -f "$archive.tmp"
buildah "${buildah_store[@]}" commit --quiet --format oci --disable-compression=false --rm "$container" "oci-archive:$archive.tmp:$image_name" >/dev/null
container=""
# The commit leaves the image in buildah's storage too; only the archive is kept.
buildah "${buildah_store[@]}" rmi --all >/dev/null 2>&1 || true
digest=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive.tmp")
mv -f "$archive.tmp" "$archive"
echo "$digest" >"$digest_file"
echo "$inputs_hash" >"$stamp"
mkdir -p "$cache/archives"
cp -f "$archive" "$cached.oci.tar.tmp" && mv -f "$cached.oci.tar.tmp" "$cached.oci.tar"
cp -f "$digest_file" "$cached.digest"
# Archives of inputs no build asked for in two days go (each is ~100 MB).
find "$cache/archives" -maxdepth 1 -name '*.oci.tar' -mtime +1 -exec sh -c 'rm -f "$1" "${1%.oci.tar}.digest"' _ {} \; 2>/dev/null || true
# The process-kubelet unpacks each image digest once (testbed/cluster/images.py) and marks it when a
# pod uses it; root filesystems no cluster used for two days go (other worktrees share the cache).
find "$cache_root/images/rootfs" -mindepth 1 -maxdepth 1 -name 'sha256-*' -mtime +1 -exec rm -rf {} + 2>/dev/null || true
log "built $archive ($(du -h "$archive" | cut -f1), $image_name) "
echo "$digest"
