"""Fixtures for tests against a real Kubernetes API server.

By default a local control plane (testbed/cluster) is started once per session, with SeaweedFS as its
S3 server. With KUBECONFIG set (and SHARDOPS_E2E_LOCAL unset), the tests use that cluster instead;
tests that need the local process-kubelet or the audit log are skipped there, and tests that need
S3 run only when SHARDOPS_S3_ENDPOINT (and the other SHARDOPS_S3_* variables) name a store.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, config
from testbed.bed import Bed
from testbed.cluster import lifecycle
from testbed.faults.recording import AuditTail
from testbed.harness import Cluster, create_namespace, external_kubeconfig, install_crds
from testbed.kits import worker as workerkit

from testbed import tenants


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "long: takes minutes; its file is run first, so that `make e2e`'s workers end together"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that hold a `long` test first, then the others, each in collection order: xdist
    (`--dist loadfile --no-loadscope-reorder`) hands files out in this order, so the longest start
    at once instead of one starting near the end while the other worker runs out of files."""
    long_files = {item.path for item in items if item.get_closest_marker("long")}
    items.sort(key=lambda item: item.path not in long_files)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    external = external_kubeconfig()
    if external is not None:
        bin_dir = lifecycle.bin_dir()
        api = config.new_client_from_config(str(external))
        yield Cluster(external, bin_dir, api, None, lifecycle.ObjectStore.from_env(os.environ))
        return
    # The bodies of Shard, Campaign status and Lease writes too, so any test can check its run's
    # history (testbed/faults/, docs/faults.md); e2e campaigns are small.
    with lifecycle.running_cluster(record_history=True) as local:
        print(
            f"\nlocal control plane: /readyz in {local.timings['readyz']:.1f}s, "
            f"node ready in {local.timings['usable']:.1f}s, S3 in {local.timings['s3']:.1f}s "
            f"({local.directory})"
        )
        api = config.new_client_from_config(str(local.kubeconfig))
        yield Cluster(local.kubeconfig, local.binaries, api, local, local.object_store)
        api.close()
        local.stop()
        left = lifecycle.leftovers(local.directory)
        assert not left, f"processes left running after the cluster stopped: {left}"


@pytest.fixture
def local_cluster(cluster: Cluster) -> Cluster:
    if cluster.local is None:
        pytest.skip("needs the local control plane (process-kubelet, audit log)")
    return cluster


@pytest.fixture
def audit_tail(local_cluster: Cluster) -> AuditTail:
    """The audit log from this test's start on: `audit_tail.history(namespace)` is the History of
    what the test's run wrote in its namespace (testbed/faults/history.py)."""
    assert local_cluster.audit_log is not None
    return AuditTail(local_cluster.audit_log)


@pytest.fixture(scope="session")
def object_store(cluster: Cluster) -> lifecycle.ObjectStore:
    if cluster.object_store is None:
        names = ", ".join(lifecycle.ObjectStore.ENV_NAMES.values())
        pytest.skip(f"needs an S3 store: against an external cluster, name one with {names}")
    return cluster.object_store


@pytest.fixture(scope="session")
def kueue(cluster: Cluster) -> Cluster:
    """The local control plane with Kueue running in it (testbed/cluster/kueue.py), started at the
    first test that asks: its Job webhooks see only Jobs labelled with a queue, so the tests after it
    pay nothing for it."""
    if cluster.local is None:
        pytest.skip("needs the local control plane, where Kueue is started on demand")
    cluster.local.start_kueue()
    print(f"\nkueue: CRDs, controller and webhooks ready in {cluster.local.timings['kueue']:.1f}s")
    return cluster


@pytest.fixture(scope="session")
def crds_installed(cluster: Cluster) -> None:
    install_crds(cluster)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = create_namespace(cluster)
    yield name
    client.CoreV1Api(cluster.api).delete_namespace(name, propagation_policy="Background")


_history_namespaces_used = itertools.count()


@pytest.fixture
def history_namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace whose writes the session's audit log records with their bodies
    (lifecycle.HISTORY_NAMESPACES), for a test that checks its run's history; each name once a session."""
    index = next(_history_namespaces_used)
    if index >= len(lifecycle.HISTORY_NAMESPACES):
        pytest.fail(f"more history-checked tests than lifecycle.HISTORY_NAMESPACES ({index + 1})")
    name = create_namespace(cluster, name=lifecycle.HISTORY_NAMESPACES[index])
    yield name
    client.CoreV1Api(cluster.api).delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def result_store(
    request: pytest.FixtureRequest, cluster: Cluster, namespace: str
) -> workerkit.StoreUnderTest:
    """The result store of a workerkit test's campaigns: the ConfigMap store unless the test is
    parametrized with `indirect=True` over workerkit.STORES; "s3" is the S3 server under a key
    prefix of the test's own, its workers with the namespace's keys (provision_namespace) on the
    local SeaweedFS."""
    kind = getattr(request, "param", "configmap")
    if kind == "s3":
        store: lifecycle.ObjectStore = request.getfixturevalue("object_store")
        prefix = f"e2e-{uuid.uuid4().hex[:8]}"
        scoped = (
            tenants.provision_namespace(
                cluster.api, namespace, directory=cluster.local.directory, store=store, prefix=prefix
            )
            if cluster.local
            else None
        )
        return workerkit.StoreUnderTest("s3", namespace, store, prefix, namespace_store=scoped)
    return workerkit.StoreUnderTest("configmap", namespace)


@pytest.fixture
def bed(cluster: Cluster, namespace: str) -> Bed:
    """The cluster under test and this test's namespace, with what the kits do there (testbed/bed.py).
    A test that needs the local control plane (audit log, process-kubelet) also asks for
    `local_cluster`, usually as `pytest.mark.usefixtures("local_cluster")`."""
    return Bed(cluster, namespace)


@pytest.fixture
def history_bed(local_cluster: Cluster, history_namespace: str) -> Bed:
    """`bed` in a history namespace of the local control plane: the audit log records its writes
    with their bodies, for a test that checks its run's history."""
    return Bed(local_cluster, history_namespace)
