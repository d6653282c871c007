"""The Done shards folded into the ledger (scheduler/fold.py), through the reconcile: results
committed before the ledger, each Lease deleted right before its Shard."""

from __future__ import annotations

import pytest

from shardops.k8s.api import (
    LEASES,
    SHARDS,
    ApiError,
)
from tests.schedulerkit import (
    NAMESPACE,
    T0,
    Clock,
    OperatorKube,
    campaign,
    put_campaign,
    put_lease,
    put_shard,
    reconciler,
    shard,
    status_of,
)


def test_the_fold_commits_each_done_shards_result_unless_its_worker_did(
    kube: OperatorKube, clock: Clock
) -> None:
    """A worker killed right after its Done write never commits its result for reuse; the fold
    does, before the ledger, and leaves a result its worker committed as it is (found by the fault
    suite's killed-workers scenario: a Done shard whose key had no committed result)."""
    from shardops.logic.idempotency import item_subkey
    from shardops.store.records import ResultMeta, StoredResult, encode_result
    from shardops.store.s3 import S3Store
    from tests.fakes3 import FakeS3

    put_campaign(kube, campaign(items=[{"id": 0}, {"id": 1}], maxAttempts=2))
    operator = reconciler(kube, clock, result_store="S3", s3_bucket="results")
    location = operator.settings.result_store_location()
    s3 = S3Store(location, NAMESPACE, client=FakeS3())
    operator.stores.use(NAMESPACE, location, s3)
    operator.reconcile(NAMESPACE, "camp")

    def stored_by(index: int, token: int, answer: str) -> tuple[str, StoredResult]:
        key = shard("camp", index, None)["spec"]["idempotencyKey"]
        text = encode_result(key, [(0, item_subkey({"id": index}), answer)])
        meta = ResultMeta("camp", f"camp-{index:05d}", "w1", 1, token)
        return key, s3.store_result(key, text, meta, 1)[0]

    done = {}
    for index in (0, 1):
        _, done[index] = stored_by(index, 1, f"answer {index}")
        result = {"ref": done[index].name, "fingerprint": done[index].fingerprint, "bytes": done[index].bytes}
        put_shard(kube, shard("camp", index, "Done", result=result))
    key_1, earlier = stored_by(1, 7, "committed before")
    s3.commit(key_1, earlier)
    key_0 = shard("camp", 0, None)["spec"]["idempotencyKey"]
    assert s3.read_result(key_0) is None, "its worker died before committing"
    operator.reconcile(NAMESPACE, "camp")
    assert status_of(kube)["folded"]["shards"] == 2
    committed_0 = s3.read_result(key_0)
    assert committed_0 is not None and committed_0.name == done[0].name
    committed_1 = s3.read_result(key_1)
    assert committed_1 is not None and committed_1.name == earlier.name, "a result committed before stays"


@pytest.mark.parametrize("lease_delete_fails", [False, True], ids=["deleted", "delete refused"])
def test_a_folded_shards_lease_goes_right_before_its_shard(
    kube: OperatorKube, clock: Clock, lease_delete_fails: bool
) -> None:
    """Not at the garbage collector's pace: the Leases alive stay within the window bound however far
    the collector falls behind. Before its Shard, so the collector, which reads every dependent of a
    deleted owner it still knows, has none left to read. A refused Lease delete leaves the Lease to
    the collector and the fold whole."""
    from shardops.store.s3 import S3Store
    from tests.fakes3 import FakeS3

    put_campaign(kube, campaign(items=[{"id": 0}, {"id": 1}], maxAttempts=2))
    operator = reconciler(kube, clock, result_store="S3", s3_bucket="results")
    location = operator.settings.result_store_location()
    operator.stores.use(NAMESPACE, location, S3Store(location, NAMESPACE, client=FakeS3()))
    operator.reconcile(NAMESPACE, "camp")
    result = {"ref": "attempts/x/t1.json", "fingerprint": "sha256:" + "0" * 64, "bytes": 10}
    for index in (0, 1):
        put_shard(kube, shard("camp", index, "Done", result=result))
        put_lease(kube, f"camp-{index:05d}", "w1", T0, seconds=30)
    if lease_delete_fails:
        kube.fail = lambda call: (
            ApiError(403, "Forbidden", "no") if call.method == "DELETE" and call.plural == "leases" else None
        )
    operator.reconcile(NAMESPACE, "camp")
    assert status_of(kube)["folded"]["shards"] == 2
    deletes = [c.path for c in kube.calls if c.method == "DELETE"]
    for name in ("camp-00000", "camp-00001"):
        assert kube.obj(SHARDS, NAMESPACE, name) is None
        assert (kube.obj(LEASES, NAMESPACE, name) is None) is not lease_delete_fails
        assert deletes.index(LEASES.path(NAMESPACE, name)) < deletes.index(SHARDS.path(NAMESPACE, name))


def test_nothing_folds_without_a_store_the_operator_may_write(kube: OperatorKube) -> None:
    """ConfigMap campaigns, and S3 ones with the campaign's own credentials, keep their Done shards."""
    from shardops.api.campaign import Campaign
    from shardops.api.shard import Shard
    from shardops.scheduler.fold import LedgerFold
    from shardops.scheduler.observed import Observed
    from shardops.scheduler.stores import Stores

    result = {"ref": "attempts/x/t1.json", "fingerprint": "sha256:" + "0" * 64, "bytes": 10}
    done = Shard.parse(shard("camp", 0, "Done", result=result))
    body = campaign(items=[{"id": 0}])
    body["status"] = {"resultStore": {"type": "ConfigMap"}}
    parsed = Campaign.parse(body)
    seen = Observed(body, parsed, [{"id": 0}], {done.name: done}, [], [])
    fold = LedgerFold(kube, Stores(parsed.current_status.result_store))  # type: ignore[arg-type]
    to_fold, folded = fold.record(seen)
    assert to_fold == [] and folded == parsed.current_status.folded
