"""Fixtures for tests against a real Kubernetes API server.

By default a local control plane (e2e/cluster) is started once per session. With KUBECONFIG set
(and SHARDOPS_E2E_LOCAL unset), the tests use that cluster instead; tests that need the local
process-kubelet or the audit log are skipped there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client, config

from e2e.cluster import lifecycle
from e2e.harness import Cluster, create_namespace, external_kubeconfig, install_crds


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    external = external_kubeconfig()
    if external is not None:
        bin_dir = lifecycle.bin_dir()
        yield Cluster(external, bin_dir, config.new_client_from_config(str(external)), None)
        return
    with lifecycle.running_cluster() as local:
        print(
            f"\nlocal control plane: /readyz in {local.timings['readyz']:.1f}s, "
            f"node ready in {local.timings['usable']:.1f}s ({local.directory})"
        )
        api = config.new_client_from_config(str(local.kubeconfig))
        yield Cluster(local.kubeconfig, local.binaries, api, local)
        api.close()
        local.stop()
        left = lifecycle.leftovers(local.directory)
        assert not left, f"processes left running after the cluster stopped: {left}"


@pytest.fixture
def local_cluster(cluster: Cluster) -> Cluster:
    if cluster.local is None:
        pytest.skip("needs the local control plane (process-kubelet, audit log)")
    return cluster


@pytest.fixture(scope="session")
def crds_installed(cluster: Cluster) -> None:
    install_crds(cluster)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = create_namespace(cluster)
    yield name
    client.CoreV1Api(cluster.api).delete_namespace(name, propagation_policy="Background")
