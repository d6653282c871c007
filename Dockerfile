# syntax=docker/dockerfile:1
# The shardops image: the operator (`shardops operator`) and the worker runtime (`shardops worker`)
# in one, with the built-in LLM worker command (`shardops llm`) and the example agent the samples
# use (`shardops-example-agent`).
#
#   docker build -t REGISTRY/shardops:0.1.0 .          # from the repository root
#   docker push REGISTRY/shardops:0.1.0
#
# `make image` builds the same image without Docker (hack/image.sh: a Debian rootfs by mmdebstrap,
# committed by buildah as an OCI archive); tests/image/test_build.py keeps the two in step. Both use
# Debian's own Python (package python3), so the venv is built for the interpreter it runs on.
# docs/install.md has the details (pushing the archive with skopeo, multi-arch builds, pinning,
# building your own worker image on top of this one). The Python entry points called here are
# tested by tests/image/test_dockerfile.py.

# Debian 12 by tag. Pin the exact bytes too by appending @sha256:<digest> (print it with
# `docker buildx imagetools inspect debian:bookworm-slim`).
ARG DEBIAN_IMAGE=debian:bookworm-slim

# --- build: a virtualenv with shardops and its runtime dependencies, versions from constraints.txt
FROM ${DEBIAN_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN apt-get update \
 && apt-get install --yes --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY operator/ operator/
COPY examples/ examples/
RUN python3 -m venv /opt/shardops \
 && /opt/shardops/bin/pip install --constraint constraints.txt . \
 && /opt/shardops/bin/shardops --help >/dev/null \
 && /opt/shardops/bin/pip uninstall --yes pip

# --- runtime: Debian's interpreter, the venv, nothing else (no compiler, no pip)
FROM ${DEBIAN_IMAGE}
# The user has a name too: Python's getpass.getuser() (kopf's peering identity) looks it up.
RUN apt-get update \
 && apt-get install --yes --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && echo 'shardops:x:65532:65532:shardops:/tmp:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'shardops:x:65532:' >>/etc/group
LABEL org.opencontainers.image.title="shardops" \
      org.opencontainers.image.description="shardops operator and worker runtime: campaigns of long, flaky work as leased, heartbeated, idempotent shards" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/shardops /opt/shardops
# Bytecode was compiled at install time; the root filesystem is read-only at run time.
ENV PATH=/opt/shardops/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric non-root user (the chart's runAsUser), so runAsNonRoot can be verified by the kubelet.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["shardops"]
CMD ["operator"]
