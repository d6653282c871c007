"""Lease claims against the real API server: one winner per race, takeover only after expiry,
and a fencing token that never repeats."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from e2e.harness import Cluster
from shardops.k8s import leases
from shardops.k8s.api import LEASES, Kube


@pytest.fixture
def kube(cluster: Cluster) -> Kube:
    return Kube.from_environment("e2e-leases", kubeconfig=str(cluster.kubeconfig))


def test_concurrent_acquire_has_exactly_one_winner(kube: Kube, namespace: str) -> None:
    now = dt.datetime.now(dt.UTC)
    results: list[leases.Claim | None] = []
    barrier = threading.Barrier(8)

    def contend(index: int) -> None:
        barrier.wait()
        results.append(leases.acquire(kube, namespace, "shard-a", f"worker-{index}", 30, now))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [claim for claim in results if claim is not None]
    assert len(results) == 8
    assert len(winners) == 1, winners
    lease = kube.get(LEASES, namespace, "shard-a")
    assert lease["spec"]["holderIdentity"] == winners[0].holder


def test_takeover_only_after_expiry_and_the_old_holder_is_fenced(kube: Kube, namespace: str) -> None:
    start = dt.datetime.now(dt.UTC)
    first = leases.acquire(kube, namespace, "shard-b", "worker-1", 10, start)
    assert first is not None and first.fencing_token == 1

    assert leases.acquire(kube, namespace, "shard-b", "worker-2", 10, start + dt.timedelta(seconds=9)) is None
    # Clocks are injected: "11 s later" is when worker-1's claim has run out without a renewal.
    second = leases.acquire(kube, namespace, "shard-b", "worker-2", 10, start + dt.timedelta(seconds=11))
    assert second is not None and second.fencing_token == 2

    with pytest.raises(leases.LeaseLost):
        leases.renew(kube, first, start + dt.timedelta(seconds=12))
    assert leases.release(kube, first) is False
    renewed = leases.renew(kube, second, start + dt.timedelta(seconds=12))
    assert renewed.fencing_token == 2 and renewed.resource_version != second.resource_version


def test_release_keeps_the_token_growing(kube: Kube, namespace: str) -> None:
    now = dt.datetime.now(dt.UTC)
    tokens = []
    for index in range(3):
        claim = leases.acquire(kube, namespace, "shard-c", f"worker-{index}", 30, now)
        assert claim is not None
        tokens.append(claim.fencing_token)
        assert leases.release(kube, claim) is True
    assert tokens == [1, 2, 3]
    assert "holderIdentity" not in kube.get(LEASES, namespace, "shard-c")["spec"]
