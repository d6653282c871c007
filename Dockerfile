# syntax=docker/dockerfile:1
# The shardops image: the operator (`shardops operator`) and the worker runtime (`shardops worker`)
# in one, with the built-in LLM worker command (`shardops llm`) and the example agent the samples
# use (`shardops-example-agent`).
#
#   docker build -t REGISTRY/shardops:0.1.0 .          # from the repository root
#   docker push REGISTRY/shardops:0.1.0
#
# docs/install.md has the details (multi-arch builds, pinning, building your own worker image on
# top of this one). The Python entry points called here are tested by tests/test_chart_image.py.

# Pinned by tag (the Python ABI the venv is built for) and by digest (the exact bytes). Both stages
# use the same image, so the venv copied into the runtime stage finds the same interpreter.
# Refresh: docker buildx imagetools inspect python:3.11.14-slim-bookworm
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# --- build: a virtualenv with shardops and its runtime dependencies, versions from constraints.txt
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY operator/ operator/
COPY examples/ examples/
RUN python -m venv /opt/shardops \
 && /opt/shardops/bin/pip install --constraint constraints.txt . \
 && /opt/shardops/bin/shardops --help >/dev/null \
 && /opt/shardops/bin/pip uninstall --yes pip

# --- runtime: the interpreter of the base image, the venv, nothing else (no compiler, no pip)
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="shardops" \
      org.opencontainers.image.description="shardops operator and worker runtime: campaigns of long, flaky work as leased, heartbeated, idempotent shards" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/shardops /opt/shardops
# Bytecode was compiled at install time; the root filesystem is read-only at run time.
ENV PATH=/opt/shardops/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric non-root user (the chart's runAsUser), so runAsNonRoot can be verified by the kubelet.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["shardops"]
CMD ["operator"]
