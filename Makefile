# shardops — every command a developer or CI needs. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

venv: $(STAMP) ## create the local venv and install shardops with its dev tools

# The `bench` extra (matplotlib, py-spy): for `make bench` and for its smoke test inside `make e2e`.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $@

tools: ## build (once, cached under ~/.cache/shardops) kube-apiserver, kube-controller-manager, etcd; install kubectl + helm
	bash testbed/cluster/build.sh

# Outside CI a machine without PyPI goes on without it: e2e/test_litellm.py then skips, naming why.
litellm: ## install (once, cached under ~/.cache/shardops) the LiteLLM proxy that e2e/test_litellm.py runs against
	bash testbed/litellm/install.sh >/dev/null \
	  || { [ -z "$${CI:-}" ] && echo "LiteLLM not installed: e2e/test_litellm.py will skip" >&2; }

image: ## the shardops image as an OCI archive, without Docker (dist/shardops-image.oci.tar; cached on its inputs)
	bash hack/image.sh

push: image ## copy that image to a registry with skopeo: make push IMAGE=registry.example.com/team/shardops[:tag]
	bash hack/push.sh "$(IMAGE)"

lint: $(STAMP) ## ruff
	$(BIN)/ruff check operator tests e2e testbed examples benchmarks
	$(BIN)/ruff format --check operator tests e2e testbed examples benchmarks

typecheck: $(STAMP) ## mypy (strict on api/ and logic/)
	$(BIN)/mypy

manifests: $(STAMP) ## regenerate crds/ and the chart's copy from the API models
	$(BIN)/shardops crds --output crds
	$(BIN)/shardops crds --output charts/shardops/crds

unit: $(BENCH_STAMP) ## tests without a cluster (the benchmarks' own unit tests need the bench extra)
	$(BIN)/pytest -q tests

# E2E_WORKERS=2 shares the e2e files out to two pytest-xdist workers (whole files, so a module's
# fixtures are set up once), in collection order: e2e/conftest.py puts the files with the longest
# tests (marked `long`) first. Each worker starts its own local control plane (ports and state
# directory chosen at run time). Two by default: many tests wait on lease and back-off clocks, and
# a second session fills those waits (on the 2-core machine, two sessions under a load of ~12 took
# as long as one on a quiet machine). E2E_WORKERS=0: one session in this process — the default
# against a KUBECONFIG cluster, which both sessions would share (the recorded history namespaces).
E2E_WORKERS ?= $(if $(KUBECONFIG),0,2)
# Its tools, image and LiteLLM proxy need nothing of one another: on a fresh machine they are built at
# the same time (the LiteLLM install is mostly PyPI downloads, the tools the Go compiler's CPU).
e2e: $(BENCH_STAMP) ## tests against the local control plane (or KUBECONFIG when set); two sessions (E2E_WORKERS=0: one)
	$(MAKE) --no-print-directory -j3 tools image litellm
	$(BIN)/pytest -q --durations=30 -n $(E2E_WORKERS) --dist loadfile --no-loadscope-reorder e2e

faults: $(BENCH_STAMP) tools image ## the fault scenarios at full size (>= 20 operator kills, stale writers, 20 frozen-worker runs): docs/contributing/faults-results.md
	SHARDOPS_FAULTS=full SHARDOPS_FAULTS_TABLE=docs/contributing/faults-results.md $(BIN)/pytest -q -s e2e/test_fault_scenarios.py

bench: $(BENCH_STAMP) tools ## benchmarks on the local control plane (or KUBECONFIG): benchmarks/results/RESULTS.md; BENCH_QUICK=1 for the quick set
	$(BIN)/python -m benchmarks

test: lint typecheck unit e2e ## everything CI runs

# The venv, the tools and the image need nothing of one another: on a fresh machine they are built at
# the same time, so the venv's and the image's downloads and installs overlap the Go compiles.
# The demo runs no Kueue (SHARDOPS_WITHOUT_KUEUE: build.sh neither builds nor requires it).
demo: export SHARDOPS_WITHOUT_KUEUE = 1
demo: ## local control plane (unless KUBECONFIG is set) + operator via Helm + a sample campaign to completion
	$(MAKE) --no-print-directory -j3 $(STAMP) tools image
	$(BIN)/python -m testbed.demo $(CLUSTER_DIR_ARG)

# Where the local control plane of cluster-up, cluster-down and demo keeps its state (certs, etcd,
# logs, kubeconfig); empty: .shardops/cluster in this checkout.
CLUSTER_DIR ?=
CLUSTER_DIR_ARG := $(if $(CLUSTER_DIR),--dir=$(CLUSTER_DIR))

cluster-up: $(STAMP) tools ## start the local control plane in the background; prints how to use it
	$(BIN)/python -m testbed.cluster.lifecycle up $(CLUSTER_DIR_ARG)

cluster-down: $(STAMP) ## stop the local control plane started by cluster-up (or demo)
	$(BIN)/python -m testbed.cluster.lifecycle down $(CLUSTER_DIR_ARG)

fmt: $(STAMP) ## format and autofix
	$(BIN)/ruff format operator tests e2e testbed examples benchmarks
	$(BIN)/ruff check --fix operator tests e2e testbed examples benchmarks

clean: ## remove the venv and local state (not the ~/.cache build)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .shardops

.PHONY: help venv tools litellm image lint typecheck manifests unit e2e bench faults test demo cluster-up cluster-down fmt clean
