"""The Done shards folded into the ledger (scheduler/fold.py), through the reconcile: results
committed before the ledger, each Lease deleted right before its Shard."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from shardops.api.common import JSON
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
    entry,
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
    from shardops.k8s.events import EventSeries
    from shardops.scheduler.fold import LedgerFold
    from shardops.scheduler.observed import Observed
    from shardops.store.installation import Stores

    result = {"ref": "attempts/x/t1.json", "fingerprint": "sha256:" + "0" * 64, "bytes": 10}
    done = Shard.parse(shard("camp", 0, "Done", result=result))
    body = campaign(items=[{"id": 0}])
    body["status"] = {"resultStore": {"type": "ConfigMap"}}
    parsed = Campaign.parse(body)
    seen = Observed(body, parsed, [{"id": 0}], {done.name: done}, [], [])
    fold = LedgerFold(kube, Stores(parsed.current_status.result_store), EventSeries())  # type: ignore[arg-type]
    to_fold, folded = fold.record(seen, parsed.current_status.folded)
    assert to_fold == [] and folded == parsed.current_status.folded


def _s3_reconciler(kube: OperatorKube, clock: Clock) -> tuple[Any, Any]:
    """The operator with an in-memory S3 store (so it folds), after its first pass."""
    from shardops.store.s3 import S3Store
    from tests.fakes3 import FakeS3

    operator = reconciler(kube, clock, result_store="S3", s3_bucket="results")
    location = operator.settings.result_store_location()
    s3 = S3Store(location, NAMESPACE, client=FakeS3())
    operator.stores.use(NAMESPACE, location, s3)
    operator.reconcile(NAMESPACE, "camp")
    return operator, s3


def _gave_up(index: int, at: Any, phase: str = "Failed") -> JSON:
    reason = "Failed" if phase == "Failed" else "Blocked"
    return shard(
        "camp",
        index,
        phase,
        history=[entry("Running", at, "Claimed"), entry(phase, at, reason, errorClass="invalid-input")],
        lastError={"class": "invalid-input", "message": f"item {index} is not valid JSON"},
        cost=0.5,
    )


def test_gave_up_shards_fold_too_so_the_status_and_the_window_stay_bounded_as_failures_grow(
    kube: OperatorKube, clock: Clock
) -> None:
    """Scattered 10 % Failed/Blocked shards through many folds: before, every gave-up Shard stayed
    live for ever, each left a gap in doneRanges and an entry in historyFolded, and the Campaign
    object grew with the campaign (issue 31: 1.68 MB + 0.99 MB at 500,000 items). Now all but the
    newest GAVE_UP_TAIL are folded with their phase and error, the counts stay exact, and the
    serialized status stays the same size however many shards have finished."""
    import datetime as dt
    import json

    from shardops.state.ledger import GAVE_UP_TAIL

    rounds, per_round = 12, 200
    total = rounds * per_round
    put_campaign(kube, campaign(items=[{"id": i} for i in range(total)], maxAttempts=2))
    operator, s3 = _s3_reconciler(kube, clock)
    result = {"ref": "attempts/x/t1.json", "fingerprint": "sha256:" + "0" * 64, "bytes": 10}
    sizes = []
    failed = blocked = 0
    for r in range(rounds):
        for index in range(r * per_round, (r + 1) * per_round):
            at = T0 + dt.timedelta(seconds=index)
            if index % 10 == 3:  # scattered, never adjacent
                phase = "Blocked" if index % 20 == 3 else "Failed"
                failed += phase == "Failed"
                blocked += phase == "Blocked"
                put_shard(kube, _gave_up(index, at, phase))
            else:
                put_shard(kube, shard("camp", index, "Done", result=result, cost=0.25))
        clock.advance(1)
        operator.reconcile(NAMESPACE, "camp")
        operator.reconcile(NAMESPACE, "camp")  # the folds a pass left for the next (MAX_FOLD a pass)
        sizes.append(len(json.dumps(status_of(kube), separators=(",", ":"))))
    status = status_of(kube)
    folded = status["folded"]
    assert folded["shards"] == total - failed - blocked
    assert folded["failed"] + folded["blocked"] == failed + blocked - GAVE_UP_TAIL
    assert status["counts"]["failed"] == failed and status["counts"]["blocked"] == blocked
    assert status["counts"]["done"] == total - failed - blocked
    live = kube.list(SHARDS, NAMESPACE)
    assert len(live) == GAVE_UP_TAIL, "only the newest gave-up shards stay"
    assert len(folded["doneRanges"]) <= GAVE_UP_TAIL + 1
    assert len(status.get("historyFolded") or {}) <= GAVE_UP_TAIL
    # Once the tail of live gave-up shards and the error threshold's window are full (1,000 shards
    # in), the same size at 2,400: nothing in it grows with the campaign (a few bytes for longer
    # numbers). Before, ~50 bytes more for every gave-up shard.
    assert max(sizes[4:]) - sizes[4] < 200, sizes
    assert max(sizes) < 16 * 1024, sizes
    # Every gave-up shard is in the ledger with its phase and error, each index once.
    lines = list(s3.read_ledger("camp", "uid-camp"))
    gave_up = {line["index"]: line for line in lines if line["phase"] in ("Failed", "Blocked")}
    assert len(gave_up) == failed + blocked - GAVE_UP_TAIL
    some = next(iter(gave_up.values()))
    assert some["lastError"]["class"] == "invalid-input" and "not valid JSON" in some["lastError"]["message"]
    assert some["reason"] in ("Failed", "Blocked")


def test_a_fold_of_gave_up_shards_says_so_on_the_campaign_and_keeps_their_failures_for_the_threshold(
    kube: OperatorKube, clock: Clock
) -> None:
    """The Shards are gone: the campaign's one GaveUpShardsFolded Warning Event counts the folded
    ones and names the first and the commands that list and retry them; their non-retryable failures
    stay in status.folded.recentFailures, so folding never hides them from the error threshold."""
    import datetime as dt

    from shardops.state.ledger import GAVE_UP_TAIL

    count = GAVE_UP_TAIL + 3
    put_campaign(kube, campaign(items=[{"id": i} for i in range(count)], maxAttempts=2))
    operator, _ = _s3_reconciler(kube, clock)
    for index in range(count):
        put_shard(kube, _gave_up(index, T0 + dt.timedelta(seconds=index)))
    operator.reconcile(NAMESPACE, "camp")
    folded = status_of(kube)["folded"]
    assert folded["failed"] == 3
    assert [f["shard"] for f in folded["recentFailures"]] == ["camp-00000", "camp-00001", "camp-00002"]
    events = [e for e in kube.events() if e.get("reason") == "GaveUpShardsFolded"]
    assert len(events) == 1
    note = events[0].get("note") or events[0].get("message") or ""
    assert events[0]["series"]["count"] == 3
    assert "camp-00000" in note and "results camp --failed" in note and "retry camp" in note


def test_events_stay_as_few_as_their_reasons_however_many_shards_fail_and_fold(
    kube: OperatorKube, clock: Clock
) -> None:
    """Issue 31: a shard failing every few passes, each pass folding about one, kept one
    GaveUpShardsFolded Event per pass (and one Failed Event per shard) alive for the API server's
    hour: 739 Events in the namespace at 500,000 items, over the window bound. Now one Event per
    campaign and reason counts them, at most one write per reason and pass."""
    import datetime as dt

    from shardops.state.ledger import GAVE_UP_TAIL

    rounds = 30
    total = GAVE_UP_TAIL + rounds
    put_campaign(kube, campaign(items=[{"id": i} for i in range(total)], maxAttempts=2))
    operator, _ = _s3_reconciler(kube, clock)
    for index in range(GAVE_UP_TAIL):
        put_shard(kube, _gave_up(index, T0 + dt.timedelta(seconds=index)))
    operator.reconcile(NAMESPACE, "camp")
    writes_before = len(kube.writes_to("events"))
    for index in range(GAVE_UP_TAIL, total):
        clock.advance(1)
        put_shard(kube, _gave_up(index, T0 + dt.timedelta(seconds=index)))
        operator.reconcile(NAMESPACE, "camp")
    assert status_of(kube)["folded"]["failed"] == rounds, "one folded a pass"
    by_reason = {e["reason"]: e for e in kube.events()}
    assert len(kube.events()) == len(by_reason) <= 5, sorted(by_reason)
    assert by_reason["GaveUpShardsFolded"]["series"]["count"] == rounds
    # One Event per reason (above), each written at most once a pass.
    per_event = collections.Counter(name for _, _, name, _ in kube.writes_to("events")[writes_before:])
    assert max(per_event.values()) <= rounds, per_event


def test_a_retry_of_every_gave_up_shard_cuts_the_folded_ones_again_within_the_backlog_bound(
    kube: OperatorKube, clock: Clock
) -> None:
    """`kubectl campaign retry` (spec.retry for all) brings back the gave-up shards folded into the
    ledger too: cut again from their ledger lines a segment at a time, never more Pending than the
    backlog bound allows, each leaving status.folded as it comes back, so the counts stay exact
    and the walk ends once the ledger is read."""
    import datetime as dt

    from shardops.k8s.api import CAMPAIGNS
    from shardops.state.ledger import GAVE_UP_TAIL

    count = GAVE_UP_TAIL + 7
    items = [{"id": i} for i in range(count)]
    # The error threshold off: 57 failures in a row would hold the campaign (its shards Paused).
    put_campaign(
        kube,
        campaign(items=items, maxAttempts=2, backlogRatio=2, errorThreshold={"consecutive": 0, "ratio": 1}),
    )
    operator, _ = _s3_reconciler(kube, clock)
    for index in range(count):
        put_shard(kube, _gave_up(index, T0 + dt.timedelta(seconds=index)))
    operator.reconcile(NAMESPACE, "camp")
    assert status_of(kube)["folded"]["failed"] == 7
    body = kube.obj(CAMPAIGNS, NAMESPACE, "camp")
    assert body is not None
    body["spec"]["retry"] = {"generation": 1}
    body["metadata"]["generation"] = 2
    kube.put(CAMPAIGNS, NAMESPACE, body)
    result = {"ref": "attempts/x/t1.json", "fingerprint": "sha256:" + "0" * 64, "bytes": 10}
    pending_per_pass = []
    for _ in range(30):
        clock.advance(1)
        operator.reconcile(NAMESPACE, "camp")
        status = status_of(kube)
        phases = ("queued", "pending", "running", "done", "failed", "blocked", "paused")
        assert sum(status["counts"].get(p, 0) for p in phases) == count, status["counts"]
        live = kube.list(SHARDS, NAMESPACE)
        pending = [s for s in live if (s.get("status") or {}).get("phase") == "Pending"]
        pending_per_pass.append(len(pending))
        for s in pending:  # the workers finish them
            put_shard(kube, shard("camp", s["spec"]["index"], "Done", result=result))
        if status["counts"]["done"] == count and not status["folded"].get("retryWalk"):
            break
    status = status_of(kube)
    assert status["counts"]["done"] == count and status["counts"]["failed"] == 0
    assert status["folded"]["failed"] == 0 and "retryWalk" not in status["folded"]
    assert status["lastRetryGeneration"] == 1
    # The live ones went back to Pending at once (as before); the folded ones came 2 (backlogRatio 2
    # of no running shard) a pass, never all 7 at once.
    assert pending_per_pass[0] == GAVE_UP_TAIL and pending_per_pass[1:5] == [2, 2, 2, 1], pending_per_pass


def test_a_retry_of_the_errored_items_cuts_the_folded_done_shards_with_errors_again_and_counts_stay_exact(
    kube: OperatorKube, clock: Clock
) -> None:
    """`kubectl campaign retry --errored` (spec.retry.errored): the folded Done shards with errored
    items are cut again from their ledger lines within the backlog bound, each with
    status.rerunErrored and the result its items errored in (what the worker reads the others'
    from); the ones without errors stay folded; itemsErrored and the done counts stay exact."""
    from shardops.k8s.api import CAMPAIGNS

    count = 6
    put_campaign(kube, campaign(items=[{"id": i} for i in range(count)], backlogRatio=2))
    operator, _ = _s3_reconciler(kube, clock)
    erred = {"ref": "attempts/x/t1.json", "fingerprint": "sha256:" + "1" * 64, "bytes": 10}
    fine = {"ref": "attempts/x/t2.json", "fingerprint": "sha256:" + "2" * 64, "bytes": 10}
    errored_indices = {1, 2, 4}
    for index in range(count):
        progress = {"done": 1, "total": 1, **({"errored": 1} if index in errored_indices else {})}
        result = erred if index in errored_indices else fine
        put_shard(kube, shard("camp", index, "Done", result=result, progress=progress))
    operator.reconcile(NAMESPACE, "camp")
    assert not kube.list(SHARDS, NAMESPACE), "all Done: all folded"
    assert status_of(kube)["itemsErrored"] == 3
    body = kube.obj(CAMPAIGNS, NAMESPACE, "camp")
    assert body is not None
    body["spec"]["retry"] = {"generation": 1, "errored": True}
    body["metadata"]["generation"] = 2
    kube.put(CAMPAIGNS, NAMESPACE, body)
    cut_again: list[int] = []
    for _ in range(20):
        clock.advance(1)
        operator.reconcile(NAMESPACE, "camp")
        status = status_of(kube)
        assert status["counts"]["done"] + status["counts"].get("pending", 0) == count, status["counts"]
        pending = [
            s for s in kube.list(SHARDS, NAMESPACE) if (s.get("status") or {}).get("phase") == "Pending"
        ]
        assert len(pending) <= 2, "within the backlog bound"
        for s in pending:
            assert s["status"]["rerunErrored"] is True and s["status"]["result"] == erred
            cut_again.append(s["spec"]["index"])
            # The worker reruns the errored item: Done, none errored, a new result.
            put_shard(
                kube, shard("camp", s["spec"]["index"], "Done", result=fine, progress={"done": 1, "total": 1})
            )
        if status["counts"]["done"] == count and not status["folded"].get("retryWalk") and not pending:
            break
    status = status_of(kube)
    assert sorted(cut_again) == sorted(errored_indices), "just the shards with errored items, each once"
    assert status["counts"]["done"] == count and not status.get("itemsErrored")
    assert status["folded"]["items"] == count and status["folded"].get("erroredItems", 0) == 0
    assert status["lastRetryGeneration"] == 1
