"""Lease claims against the real API server: one winner per race, takeover only after expiry (judged
on the taker's own clock from when it saw the claim renewed), and a fencing token that never repeats."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from testbed.harness import Cluster

from shardops.k8s import leases
from shardops.k8s.api import LEASES, Kube
from shardops.logic.leases import Renewals


@pytest.fixture
def kube(cluster: Cluster) -> Kube:
    return Kube.from_environment("e2e-leases", kubeconfig=str(cluster.kubeconfig))


def test_concurrent_acquire_has_exactly_one_winner(kube: Kube, namespace: str) -> None:
    now = dt.datetime.now(dt.UTC)
    results: list[leases.Claim | None] = []
    barrier = threading.Barrier(8)

    def contend(index: int) -> None:
        barrier.wait()
        seen = Renewals(time.monotonic)
        results.append(leases.acquire(kube, namespace, "shard-a", f"worker-{index}", 30, now, seen=seen))

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
    first = leases.acquire(kube, namespace, "shard-b", "worker-1", 10, start, seen=Renewals(time.monotonic))
    assert first is not None and first.fencing_token == 1

    # Worker-2's monotonic clock is injected: it first sees the claim at 0 and is told 9, then 10
    # seconds have passed without a renewal.
    monotonic = [0.0]
    seen = Renewals(lambda: monotonic[0])
    for elapsed in (0.0, 9.0):
        monotonic[0] = elapsed
        assert leases.acquire(kube, namespace, "shard-b", "worker-2", 10, start, seen=seen) is None
    monotonic[0] = 10.0
    second = leases.acquire(kube, namespace, "shard-b", "worker-2", 10, start, seen=seen)
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
        claim = leases.acquire(
            kube, namespace, "shard-c", f"worker-{index}", 30, now, seen=Renewals(time.monotonic)
        )
        assert claim is not None
        tokens.append(claim.fencing_token)
        assert leases.release(kube, claim) is True
    assert tokens == [1, 2, 3]
    assert "holderIdentity" not in kube.get(LEASES, namespace, "shard-c")["spec"]
