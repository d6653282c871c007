#!/usr/bin/env bash
# `make push`: copy the image `make image` built to a registry, without Docker.
#
#   bash hack/push.sh REGISTRY/REPOSITORY              # tag: the version in pyproject.toml
#   bash hack/push.sh REGISTRY/REPOSITORY:TAG
#   make push IMAGE=registry.example.com/team/shardops
#
# skopeo copies the OCI archive's manifest unchanged, so the registry holds the digest `make image`
# printed; this script prints it last, ready for the chart's `image.digest`. Credentials are
# skopeo's own: `skopeo login REGISTRY` first, or SKOPEO_DEST_CREDS=USER:TOKEN for one push.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
archive="$repo/dist/shardops-image.oci.tar"
digest_file="$repo/dist/shardops-image.digest"

destination=${1:-}
if [ -z "$destination" ]; then
  echo "usage: hack/push.sh REGISTRY/REPOSITORY[:TAG] (or make push IMAGE=...)" >&2
  exit 2
fi
if [ ! -s "$archive" ] || [ ! -s "$digest_file" ]; then
  echo "push: $archive not found: run make image first" >&2
  exit 1
fi
digest=$(cat "$digest_file")
if [[ ! "$digest" =~ ^sha256:[0-9a-f]{64}$ ]]; then
  echo "push: $digest_file holds no image digest ('$digest'): run IMAGE_REBUILD=1 make image" >&2
  exit 1
fi
# A tag is what follows the last ':' after the last '/' (a registry port like :5000 is not one).
last_part=${destination##*/}
if [[ "$last_part" != *:* ]]; then
  version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)
  destination="$destination:$version"
fi

credentials=()
if [ -n "${SKOPEO_DEST_CREDS:-}" ]; then
  credentials=(--dest-creds "$SKOPEO_DEST_CREDS")
fi
echo "[push] oci-archive:$archive -> docker://$destination" >&2
skopeo copy "${credentials[@]}" "oci-archive:$archive" "docker://$destination"
repository=${destination%:*}
echo "[push] pushed; install the chart with --set image.repository=$repository --set image.digest=$digest" >&2
echo "$digest"
