"""The campaign reconcile against an in-memory API server: what it creates, what it moves, what it writes."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest

from schedulerkit import (
    NAMESPACE,
    T0,
    Clock,
    OperatorKube,
    campaign,
    condition,
    entry,
    put_campaign,
    put_lease,
    put_shard,
    reconciler,
    shard,
    shard_of,
    status_of,
)
from shardops.k8s import jobs
from shardops.k8s.api import (
    CAMPAIGNS,
    CONFIGMAPS,
    EVENTS,
    JOBS,
    LEASES,
    PODS,
    SHARDS,
    AlreadyExists,
    ApiError,
    Resource,
)
from shardops.scheduler.reconcile import Reconciler

JSON = dict[str, Any]


@pytest.fixture
def kube() -> OperatorKube:
    return OperatorKube()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def run(kube: OperatorKube, clock: Clock, name: str = "camp") -> None:
    reconciler(kube, clock).reconcile(NAMESPACE, name)


def watching(kube: OperatorKube, clock: Clock, name: str = "camp") -> Reconciler:
    """An operator that has made one pass: it has seen the claims as they are now. Expiry is judged on
    its own clock from when it saw a claim renewed, so a fresh one never reclaims at once."""
    operator = reconciler(kube, clock)
    operator.reconcile(NAMESPACE, name)
    return operator


def beat(kube: OperatorKube, clock: Clock, shard_name: str = "camp-00000", seconds: int = 30) -> None:
    """A heartbeat as a worker writes it: the Lease renewed, then lastHeartbeat and leaseUntil."""
    put_lease(kube, shard_name, "w1", clock.now, seconds=seconds)
    until = clock.now + dt.timedelta(seconds=seconds)
    status = {"lastHeartbeat": clock.now.isoformat(), "leaseUntil": until.isoformat()}
    kube.patch(SHARDS, NAMESPACE, shard_name, {"status": status}, subresource="status")


def names(kube: OperatorKube, resource: object = SHARDS) -> list[str]:
    return sorted(o["metadata"]["name"] for o in kube.list(resource, NAMESPACE))  # type: ignore[arg-type]


# --- invalid campaigns --------------------------------------------------------------------------------


def test_missing_items_configmap_is_reported_and_nothing_is_created(kube: OperatorKube, clock: Clock) -> None:
    body = campaign(items=None)
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    put_campaign(kube, body)
    run(kube, clock)
    run(kube, clock.advance(5))
    status = status_of(kube)
    ready = condition(status, "Ready")
    assert status["phase"] == "Invalid"
    assert (ready["status"], ready["reason"]) == ("False", "ItemsNotFound")
    assert "create it" in ready["message"] and ready["observedGeneration"] == 1
    assert names(kube) == [] and names(kube, JOBS) == []
    assert kube.event_reasons("camp") == ["ItemsNotFound"], "one Event per problem, not per pass"


def test_malformed_jsonl_names_the_line(kube: OperatorKube, clock: Clock) -> None:
    body = campaign()
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    put_campaign(kube, body)
    kube.put(
        CONFIGMAPS,
        NAMESPACE,
        {"metadata": {"name": "questions"}, "data": {"items.jsonl": '{"a":1}\n\n{oops\n'}},
    )
    run(kube, clock)
    ready = condition(status_of(kube), "Ready")
    assert ready["reason"] == "ItemsInvalid" and "line 3" in ready["message"]
    assert names(kube) == []


def test_items_too_big_for_a_shard_are_reported_before_any_shard_is_cut(
    kube: OperatorKube, clock: Clock
) -> None:
    # Each item fits; three of them in one shard would not fit its Shard object (the API server
    # would refuse its create, 413, pass after pass). Said up front, with the shardSize that fits.
    body = campaign(items=[{"n": i, "pad": "x" * 400_000} for i in range(4)], shardSize=3)
    put_campaign(kube, body)
    run(kube, clock)
    run(kube, clock.advance(5))
    status = status_of(kube)
    ready = condition(status, "Ready")
    assert status["phase"] == "Invalid" and ready["reason"] == "ItemsInvalid"
    assert "spec.items: the items of shard 0 pass 1,048,576 bytes at item 2" in ready["message"]
    assert "lower spec.shardSize (about 2 items of this size fit)" in ready["message"]
    assert names(kube) == [] and names(kube, JOBS) == []
    assert kube.event_reasons("camp") == ["ItemsInvalid"]


def test_spec_invalid_past_admission_is_reported(kube: OperatorKube, clock: Clock) -> None:
    body = campaign(shardSize=0)
    put_campaign(kube, body)
    run(kube, clock)
    ready = condition(status_of(kube), "Ready")
    assert ready["reason"] == "InvalidSpec" and "shardSize" in ready["message"]
    assert names(kube) == []


def test_a_name_too_long_for_labels_is_reported(kube: OperatorKube, clock: Clock) -> None:
    """The CRD refuses it; one made before that rule existed is reported, with the rule's words."""
    long_name = "c" * 64
    put_campaign(kube, campaign(long_name))
    run(kube, clock, long_name)
    ready = condition(status_of(kube, long_name), "Ready")
    assert ready["reason"] == "InvalidSpec" and "has at most 63 characters" in ready["message"]


# --- materialization and workers --------------------------------------------------------------------


def test_first_pass_materializes_within_the_backlog_bound_and_starts_workers(
    kube: OperatorKube, clock: Clock
) -> None:
    put_campaign(kube, campaign(items=[{"id": i} for i in range(100)], backlogRatio=2, maxConcurrency=3))
    run(kube, clock)
    assert names(kube) == ["camp-00000", "camp-00001"], "ratio 2 * max(running 0, 1)"
    assert {shard_of(kube, n)["status"]["phase"] for n in names(kube)} == {"Pending"}
    assert len(names(kube, JOBS)) == 3, "maxConcurrency Jobs: 98 items wait to be cut, only for the bound"
    status = status_of(kube)
    assert status["counts"]["pending"] == 2 and status["counts"]["queued"] == 98
    assert status["counts"]["total"] == 100 and status["counts"]["materialized"] == 2
    backpressured = condition(status, "Backpressured")
    assert backpressured["status"] == "True" and "pending 2 of bound 2" in backpressured["message"]
    assert kube.event_reasons("camp-00000") == [], "materializing is routine: history, not an Event"


def test_a_new_shards_pending_write_goes_alongside_the_next_create(kube: OperatorKube, clock: Clock) -> None:
    """The creates of a pass go one after another in index order; each new shard's Pending write
    does not hold them up: while shard 0's is held back, shard 1 is created."""
    put_campaign(kube, campaign(items=[{"id": i} for i in range(10)], backlogRatio=3, maxConcurrency=1))
    next_created = threading.Event()
    held: list[bool] = []

    def hold_the_first_pending_write(_kube: object, verb: str, resource: object, name: str) -> None:
        if resource == SHARDS and verb == "create" and name == "camp-00001":
            next_created.set()
        if resource == SHARDS and verb == "patch" and name == "camp-00000" and not held:
            held.append(next_created.wait(10))

    kube.before.append(hold_the_first_pending_write)
    run(kube, clock)
    assert held == [True], "shard 1's create waited for shard 0's Pending write"
    creates = [c.name for c in kube.calls if (c.method, c.plural) == ("POST", "shards")]
    assert creates == ["camp-00000", "camp-00001", "camp-00002"], "in index order, ratio 3 * 1"
    assert {shard_of(kube, n)["status"]["phase"] for n in creates} == {"Pending"}


def test_a_failed_pending_write_stops_the_pass_and_leaves_no_gap(kube: OperatorKube, clock: Clock) -> None:
    """A Pending write that fails ends the pass with its error once the writes sent are answered; the
    shards created are the first ones, in order (no index skipped below the highest), and the one
    left Queued is made Pending by the next pass."""
    put_campaign(kube, campaign(items=[{"id": i} for i in range(10)], backlogRatio=5, maxConcurrency=1))
    failing = {"camp-00001"}

    def refuse(call: Any) -> BaseException | None:
        if call.plural == "shards" and call.method == "PATCH" and call.name in failing:
            return ApiError(500, "InternalError", "etcd hiccup")
        return None

    kube.fail = refuse
    with pytest.raises(ApiError, match="etcd hiccup"):
        run(kube, clock)
    created = names(kube)
    assert created == [f"camp-{i:05d}" for i in range(len(created))] and "camp-00001" in created
    assert "status" not in shard_of(kube, "camp-00001") or shard_of(kube, "camp-00001")["status"].get(
        "phase"
    ) in (None, "Queued")
    failing.clear()
    run(kube, clock)
    assert shard_of(kube, "camp-00001")["status"]["phase"] == "Pending"
    assert names(kube)[: len(created)] == created


def test_more_shards_once_some_run_and_never_more_jobs_than_the_cap(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": i} for i in range(100)], backlogRatio=2, maxConcurrency=3))
    for index in range(3):
        put_shard(kube, shard("camp", index, "Running", owner=f"w{index}"))
        put_lease(kube, f"camp-{index:05d}", f"w{index}", T0)
    run(kube, clock)
    pending = [n for n in names(kube) if shard_of(kube, n)["status"]["phase"] == "Pending"]
    assert len(pending) == 6, "ratio 2 * running 3"
    assert pending[0] == "camp-00003", "FIFO: the next items"
    assert names(kube, JOBS) == [], "three shards run, three is the cap"


def test_worker_job_shape(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": 1}]))
    run(kube, clock)
    (job,) = kube.list(JOBS, NAMESPACE)
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-camp"
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "shardops",
        "worker",
        "--campaign",
        "camp",
    ]


class LostAnswerKube(OperatorKube):
    """The API server commits the first worker Job create, but its answer (a 504) makes the client
    send the same create again, as a client that repeats a create after a 5xx does."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 1

    def create(self, resource: Resource, namespace: str | None, body: JSON) -> JSON:
        if resource is JOBS and self.lost:
            self.lost -= 1
            super().create(resource, namespace, body)  # committed; the answer is lost
        return super().create(resource, namespace, body)


def test_a_worker_job_create_sent_again_after_a_lost_answer_makes_one_job(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    kube = LostAnswerKube()
    put_campaign(kube, campaign(items=[{"id": 1}], maxConcurrency=1))
    run(kube, clock)
    assert names(kube, JOBS) == ["camp-worker-1"], "the repeated create found its own Job (409)"
    assert not [r for r in caplog.records if "worker Job" in r.getMessage()], "taken as made, no error"
    run(kube, clock.advance(5))
    assert names(kube, JOBS) == ["camp-worker-1"], "counted as made: maxConcurrency 1 holds"


def test_a_repeated_worker_job_create_returns_the_job_made_and_refuses_anothers(kube: OperatorKube) -> None:
    owner = {"apiVersion": "shardops.dev/v1alpha1", "kind": "Campaign", "name": "camp", "controller": True}
    body = {"metadata": {"name": "camp-worker-1", "ownerReferences": [{**owner, "uid": "uid-camp"}]}}
    made = jobs.create(kube, NAMESPACE, body)
    assert jobs.create(kube, NAMESPACE, body)["metadata"]["uid"] == made["metadata"]["uid"]
    other = {"metadata": {"name": "camp-worker-1", "ownerReferences": [{**owner, "uid": "uid-new"}]}}
    with pytest.raises(AlreadyExists):
        jobs.create(kube, NAMESPACE, other)


def test_worker_jobs_are_numbered_past_every_listed_job(kube: OperatorKube, clock: Clock) -> None:
    """Past the Jobs of a deleted campaign of the same name too, which keep their names until the
    garbage collector takes them; a taken name is never adopted."""
    put_campaign(kube, campaign(items=[{"id": i} for i in range(3)], maxConcurrency=2))
    old_owner = {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "name": "camp",
        "uid": "uid-old",
        "controller": True,
    }
    kube.put(
        JOBS,
        NAMESPACE,
        {
            "metadata": {
                "name": "camp-worker-4",
                "labels": {"shardops.dev/campaign": "camp", "shardops.dev/role": "worker"},
                "annotations": {"shardops.dev/worker-number": "4"},
                "ownerReferences": [old_owner],
            },
            "status": {"conditions": [{"type": "Complete", "status": "True"}]},
        },
    )
    run(kube, clock)
    assert names(kube, JOBS) == ["camp-worker-4", "camp-worker-5", "camp-worker-6"]


OLD_INCARNATION = {
    "apiVersion": "shardops.dev/v1alpha1",
    "kind": "Campaign",
    "name": "camp",
    "uid": "uid-old",
    "controller": True,
}


def test_a_reapplied_campaign_neither_counts_nor_adopts_the_deleted_ones_shards(
    kube: OperatorKube, clock: Clock
) -> None:
    """Deleted and applied again under its name: the old Shards wait for the garbage collector."""
    put_campaign(kube, campaign(items=[{"id": 0}, {"id": 1}]))
    for index in range(2):
        body = shard("camp", index, "Done")
        body["metadata"]["ownerReferences"] = [OLD_INCARNATION]
        put_shard(kube, body)
    run(kube, clock)
    status = status_of(kube)
    assert status["phase"] != "Succeeded" and status["counts"]["done"] == 0
    assert status["counts"]["materialized"] == 0, "the old shards are not this campaign's"
    for name in ("camp-00000", "camp-00001"):
        assert shard_of(kube, name)["metadata"]["ownerReferences"] == [OLD_INCARNATION], "not adopted"
        assert shard_of(kube, name)["status"]["phase"] == "Done"
    for name in ("camp-00000", "camp-00001"):
        del kube.objects[("shards", NAMESPACE, name)]  # the garbage collector
    run(kube, clock.advance(5))
    assert names(kube) == ["camp-00000", "camp-00001"]
    assert {shard_of(kube, n)["metadata"]["ownerReferences"][0]["uid"] for n in names(kube)} == {"uid-camp"}
    assert {shard_of(kube, n)["status"]["phase"] for n in names(kube)} == {"Pending"}


def test_status_is_written_only_when_it_changed(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": 1}]))
    run(kube, clock)
    writes = kube.status_writes("camp")
    run(kube, clock.advance(1))
    run(kube, clock.advance(1))
    assert kube.status_writes("camp") == writes


# --- lease sweep -------------------------------------------------------------------------------------


def _running(kube: OperatorKube, attempt: int = 1, **status: object) -> None:
    """Claimed by w1 at T0 for 30 s, as a claim writes it (the Lease is the caller's)."""
    status.setdefault("leaseUntil", (T0 + dt.timedelta(seconds=30)).isoformat())
    claimed = entry("Running", T0, "Claimed", attempt, owner="w1")
    put_shard(
        kube,
        shard(
            "camp",
            0,
            "Running",
            attempt=attempt,
            owner="w1",
            history=[entry("Pending", T0, "Materialized"), claimed],
            **status,
        ),
    )


def test_expired_lease_sends_the_shard_back_with_attempt_plus_one(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": 0}]))
    _running(kube)
    put_lease(kube, "camp-00000", "w1", T0, seconds=30)
    operator = watching(kube, clock)
    operator.reconcile(NAMESPACE, "camp")
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Running", "first seen now: not expired yet"
    clock.advance(30)
    operator.reconcile(NAMESPACE, "camp")
    s = shard_of(kube, "camp-00000")["status"]
    assert (s["phase"], s["attempt"]) == ("Pending", 2)
    assert s["history"][-1]["reason"] == "LeaseExpired" and s["lastError"]["class"] == "unknown"
    assert "holderIdentity" not in kube.obj(LEASES, NAMESPACE, "camp-00000")["spec"]
    assert "LeaseExpired" in kube.event_reasons("camp-00000")


def test_live_lease_is_not_stolen(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": 0}]))
    _running(kube, lastHeartbeat=T0.isoformat())
    put_lease(kube, "camp-00000", "w1", T0, seconds=30)
    run(kube, clock.advance(29))
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Running"


def test_a_holder_whose_clock_runs_behind_is_never_reclaimed_while_it_renews(
    kube: OperatorKube, clock: Clock
) -> None:
    """Its clock is 30 s behind the operator's, as its leaseSeconds: every leaseUntil and renewTime it
    writes has already passed by the operator's clock. Judged on the operator's own clock from when
    it saw each renewal, it stays alive for as long as it renews — and is reclaimed a lease duration
    after it stops."""
    put_campaign(kube, campaign(items=[{"id": 0}]))
    behind = dt.timedelta(seconds=30)
    _running(kube, leaseUntil=T0.isoformat(), lastHeartbeat=(T0 - behind).isoformat())
    put_lease(kube, "camp-00000", "w1", T0 - behind, seconds=30)
    operator = watching(kube, clock)
    for _ in range(12):
        clock.advance(5)
        if clock.now.second % 10 == 0:
            holder_now = clock.now - behind
            put_lease(kube, "camp-00000", "w1", holder_now, seconds=30)
            until = holder_now + dt.timedelta(seconds=30)
            status = {"lastHeartbeat": holder_now.isoformat(), "leaseUntil": until.isoformat()}
            kube.patch(SHARDS, NAMESPACE, "camp-00000", {"status": status}, subresource="status")
        operator.reconcile(NAMESPACE, "camp")
        s = shard_of(kube, "camp-00000")["status"]
        assert (s["phase"], s["attempt"]) == ("Running", 1), s.get("lastError")
    clock.advance(31)  # it stopped renewing
    operator.reconcile(NAMESPACE, "camp")
    s = shard_of(kube, "camp-00000")["status"]
    assert (s["phase"], s["attempt"], s["history"][-1]["reason"]) == ("Pending", 2, "LeaseExpired")


def test_a_shard_whose_status_shows_a_live_lease_costs_no_lease_read(
    kube: OperatorKube, clock: Clock
) -> None:
    put_campaign(kube, campaign(items=[{"id": 0}]))
    until = T0 + dt.timedelta(seconds=30)
    _running(kube, lastHeartbeat=T0.isoformat(), leaseUntil=until.isoformat())
    put_lease(kube, "camp-00000", "w1", T0, seconds=30)
    operator = watching(kube, clock.advance(10))
    clock.advance(29)
    operator.reconcile(NAMESPACE, "camp")
    assert [c for c in kube.calls if c.plural == "leases"] == []
    # Not seen renewed for a lease duration, the Lease is read, and it decides: renewed since (the
    # shard's own status write has not landed).
    kube.patch(
        LEASES, NAMESPACE, "camp-00000", {"spec": {"renewTime": (T0 + dt.timedelta(seconds=29)).isoformat()}}
    )
    clock.advance(1)
    operator.reconcile(NAMESPACE, "camp")
    assert [c.method for c in kube.calls if c.plural == "leases"][-1] == "GET"
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Running"


def test_a_lease_taken_over_since_the_shard_was_written_is_not_revoked(
    kube: OperatorKube, clock: Clock
) -> None:
    """The shard still shows A's expired claim, but B has taken the Lease over and renews it: the
    sweep judged A's claim, so it must leave B's live one alone (no revoke, no attempt charged)."""
    put_campaign(kube, campaign(items=[{"id": 0}]))
    _running(kube, leaseUntil=T0.isoformat())
    operator = watching(kube, clock)
    put_lease(kube, "camp-00000", "w2", T0 + dt.timedelta(seconds=31), seconds=30)
    clock.advance(32)
    operator.reconcile(NAMESPACE, "camp")
    lease = kube.obj(LEASES, NAMESPACE, "camp-00000")
    assert lease is not None and lease["spec"].get("holderIdentity") == "w2", "B's live claim was revoked"
    s = shard_of(kube, "camp-00000")["status"]
    assert (s["phase"], s["attempt"]) == ("Running", 1)
    assert kube.writes_to("leases") == [] and "LeaseExpired" not in kube.event_reasons("camp-00000")


def test_a_renewal_that_lands_first_wins(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": 0}]))
    _running(kube)
    put_lease(kube, "camp-00000", "w1", T0, seconds=30)

    def renew_first(fake: object, verb: str, resource: object, name: str) -> None:
        if verb == "patch" and resource is LEASES:
            kube.before.clear()
            kube.patch(LEASES, NAMESPACE, name, {"spec": {"renewTime": "2026-03-01T12:00:31.000000Z"}})

    operator = watching(kube, clock)
    kube.before.append(renew_first)
    clock.advance(31)
    operator.reconcile(NAMESPACE, "camp")
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Running"


def test_expiry_on_the_last_attempt_of_a_shard_whose_result_verifies_completes_it(
    kube: OperatorKube, clock: Clock
) -> None:
    # The worker stored the whole result, then its Done write never landed before the lease ran out.
    from shardops.logic.idempotency import item_subkey
    from shardops.store.configmap import read_result, store_result
    from shardops.store.records import ResultMeta, encode_result

    put_campaign(kube, campaign(items=[{"id": 0}], maxAttempts=2))
    _running(kube, attempt=2, fencingToken=1)
    put_lease(kube, "camp-00000", "w1", T0, seconds=30)
    key = shard_of(kube, "camp-00000")["spec"]["idempotencyKey"]
    text = encode_result(key, [(0, item_subkey({"id": 0}), "the answer")])
    stored, _ = store_result(
        kube, NAMESPACE, key, text, ResultMeta("camp", "camp-00000", "w1", 2, 1), 1, 10_000
    )  # type: ignore[arg-type]
    operator = watching(kube, clock)
    clock.advance(31)
    operator.reconcile(NAMESPACE, "camp")
    s = shard_of(kube, "camp-00000")["status"]
    assert (s["phase"], s["attempt"]) == ("Done", 2), s.get("lastError")
    assert s["result"] == {"ref": stored.name, "fingerprint": stored.fingerprint, "bytes": stored.bytes}
    assert s["history"][-1]["reason"] == "Completed" and "owner" not in s
    assert "Blocked" not in kube.event_reasons("camp-00000")
    assert status_of(kube)["phase"] == "Succeeded"
    assert read_result(kube, NAMESPACE, key) == stored, "committed for reuse, as a worker would"  # type: ignore[arg-type]


def test_a_zombie_the_operator_completes_from_its_stored_s3_result_is_committed_for_reuse(
    kube: OperatorKube, clock: Clock
) -> None:
    """The worker stored its attempt object, then the API went away and its claim ran out before its
    Done write. The sweep completes the shard with that object, and commits it as the key's result,
    as a worker completing a zombie does: re-applying the campaign reuses it (found by the fault
    suite's control-plane restart scenario: 5 results left uncommitted)."""
    from fakes3 import FakeS3
    from shardops.logic.idempotency import item_subkey
    from shardops.store.records import ResultMeta, encode_result
    from shardops.store.s3 import S3Store

    put_campaign(kube, campaign(items=[{"id": 0}], maxAttempts=2))
    _running(kube, attempt=1, fencingToken=1)
    put_lease(kube, "camp-00000", "w1", T0, seconds=30)
    operator = reconciler(kube, clock, result_store="S3", s3_bucket="results")
    location = operator.settings.result_store_location()
    s3 = S3Store(location, NAMESPACE, client=FakeS3())
    operator._stores[(NAMESPACE, location.model_dump_json())] = s3
    operator.reconcile(NAMESPACE, "camp")
    key = shard_of(kube, "camp-00000")["spec"]["idempotencyKey"]
    text = encode_result(key, [(0, item_subkey({"id": 0}), "the answer")])
    stored, _ = s3.store_result(key, text, ResultMeta("camp", "camp-00000", "w1", 1, 1), 1)
    assert s3.read_result(key) is None, "written by the claim, not committed: its Done never landed"
    clock.advance(31)
    operator.reconcile(NAMESPACE, "camp")
    # Done, then folded into the ledger and deleted in the same pass (an S3 store folds).
    assert status_of(kube)["folded"]["shards"] == 1 and kube.obj(SHARDS, NAMESPACE, "camp-00000") is None
    committed = s3.read_result(key)
    assert committed is not None and committed.name == stored.name


def test_the_fold_commits_each_done_shards_result_unless_its_worker_did(
    kube: OperatorKube, clock: Clock
) -> None:
    """A worker killed right after its Done write never commits its result for reuse; the fold
    does, before the ledger, and leaves a result its worker committed as it is (found by the fault
    suite's killed-workers scenario: a Done shard whose key had no committed result)."""
    from fakes3 import FakeS3
    from shardops.logic.idempotency import item_subkey
    from shardops.store.records import ResultMeta, StoredResult, encode_result
    from shardops.store.s3 import S3Store

    put_campaign(kube, campaign(items=[{"id": 0}, {"id": 1}], maxAttempts=2))
    operator = reconciler(kube, clock, result_store="S3", s3_bucket="results")
    location = operator.settings.result_store_location()
    s3 = S3Store(location, NAMESPACE, client=FakeS3())
    operator._stores[(NAMESPACE, location.model_dump_json())] = s3
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
    from fakes3 import FakeS3
    from shardops.store.s3 import S3Store

    put_campaign(kube, campaign(items=[{"id": 0}, {"id": 1}], maxAttempts=2))
    operator = reconciler(kube, clock, result_store="S3", s3_bucket="results")
    location = operator.settings.result_store_location()
    operator._stores[(NAMESPACE, location.model_dump_json())] = S3Store(location, NAMESPACE, client=FakeS3())
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


def test_expiry_on_the_last_attempt_blocks_with_the_error_and_its_event(
    kube: OperatorKube, clock: Clock
) -> None:
    put_campaign(kube, campaign(items=[{"id": 0}], maxAttempts=2))
    _running(kube, attempt=2)
    put_lease(kube, "camp-00000", "w1", T0, seconds=30)
    operator = watching(kube, clock)
    clock.advance(31)
    operator.reconcile(NAMESPACE, "camp")
    s = shard_of(kube, "camp-00000")["status"]
    assert s["phase"] == "Blocked"
    event = kube.obj(EVENTS, NAMESPACE, s["lastError"]["event"])
    assert event is not None and event["reason"] == "Blocked"
    status = status_of(kube)
    assert status["phase"] == "Completed" and status["blockedShards"] == ["camp-00000"]
    assert condition(status, "Degraded")["status"] == "True"


def test_stall_is_reported_once_and_revoke_takes_the_claim_back(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": 0}], stall={"policy": "Report", "heartbeats": 2}))
    _running(kube, progress={"done": 0, "total": 1})
    operator = reconciler(kube, clock)
    for _ in range(3):
        clock.advance(10)
        beat(kube, clock)
        operator.reconcile(NAMESPACE, "camp")
    assert kube.event_reasons("camp-00000").count("Stalled") == 1
    assert condition(status_of(kube), "Stalled")["status"] == "True"
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Running", "Report only reports"

    kube.patch(CAMPAIGNS, NAMESPACE, "camp", {"spec": {"stall": {"policy": "Revoke", "heartbeats": 2}}})
    operator.reconcile(NAMESPACE, "camp")
    s = shard_of(kube, "camp-00000")["status"]
    assert (s["phase"], s["attempt"], s["history"][-1]["reason"]) == ("Pending", 2, "Revoked")


def test_a_heartbeat_already_on_its_way_does_not_turn_a_revoke_into_a_lease_expiry(
    kube: OperatorKube, clock: Clock
) -> None:
    """The Lease is revoked, then a heartbeat the worker sent before it noticed moves the shard: the
    revoke is still recorded as Revoked (attempt+1), not left for the next pass to find a Lease
    without a holder and call it an expired lease."""
    put_campaign(kube, campaign(items=[{"id": 0}], stall={"policy": "Revoke", "heartbeats": 2}))
    _running(kube, progress={"done": 0, "total": 1}, lastHeartbeat=T0.isoformat())
    put_lease(kube, "camp-00000", "w1", T0, seconds=30)
    operator = reconciler(kube, clock)
    operator.reconcile(NAMESPACE, "camp")
    clock.advance(25)
    beat(kube, clock)

    def late_heartbeat(fake: object, verb: str, resource: object, name: str) -> None:
        if verb == "patch" and resource is SHARDS:
            kube.before.clear()
            beat = {"status": {"lastHeartbeat": clock.now.isoformat()}}
            kube.patch(SHARDS, NAMESPACE, name, beat, subresource="status")

    kube.before.append(late_heartbeat)
    operator.reconcile(NAMESPACE, "camp")
    s = shard_of(kube, "camp-00000")["status"]
    assert (s["phase"], s["attempt"], s["history"][-1]["reason"]) == ("Pending", 2, "Revoked")
    assert s["lastError"]["class"] == "timeout" and "no progress" in s["lastError"]["message"]
    assert "LeaseExpired" not in kube.event_reasons("camp-00000")


# --- recorded actions, budget, suspend, finalize ---------------------------------------------------------


def test_retry_is_acted_on_once(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": 0}], retry={"generation": 1}))
    put_shard(kube, shard("camp", 0, "Blocked", attempt=3))
    run(kube, clock)
    s = shard_of(kube, "camp-00000")["status"]
    assert (s["phase"], s["attempt"]) == ("Pending", 1)
    assert status_of(kube)["lastRetryGeneration"] == 1
    run(kube, clock.advance(1))
    # The operator's event says it acted; RetryRequested is the CLI's (the user asked).
    assert kube.event_reasons("camp").count("RetryStarted") == 1
    assert "RetryRequested" not in kube.event_reasons("camp")
    assert [h["reason"] for h in shard_of(kube, "camp-00000")["status"]["history"]].count("Retried") == 1


def test_retry_with_a_shard_list_retries_only_those_and_names_the_skipped(
    kube: OperatorKube, clock: Clock
) -> None:
    listed = ["camp-00000", "camp-00002"]
    put_campaign(
        kube, campaign(items=[{"id": i} for i in range(3)], retry={"generation": 1, "shards": listed})
    )
    put_shard(kube, shard("camp", 0, "Failed"))
    put_shard(kube, shard("camp", 1, "Failed"))
    put_shard(kube, shard("camp", 2, "Done"))
    run(kube, clock)
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Pending"
    assert shard_of(kube, "camp-00001")["status"]["phase"] == "Failed", "not listed: left alone"
    assert shard_of(kube, "camp-00002")["status"]["phase"] == "Done"
    assert status_of(kube)["lastRetryGeneration"] == 1
    run(kube, clock.advance(1))
    [event] = [e for e in kube.list(EVENTS, NAMESPACE) if e["reason"] == "RetryStarted"]
    assert event["regarding"]["name"] == "camp"
    assert "spec.retry.generation=1 (2 listed): 1 shard(s) back to Pending (camp-00000)" in event["note"]
    assert "skipped (not Blocked or Failed): camp-00002 (Done)" in event["note"]
    assert "camp-00001" not in event["note"]
    degraded = condition(status_of(kube), "Degraded")
    assert "kubectl campaign retry camp" in degraded["message"]


def test_suspend_pauses_unclaimed_shards_and_unsuspend_resumes(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": i} for i in range(3)], suspend=True))
    put_shard(kube, shard("camp", 0, "Pending"))
    put_shard(kube, shard("camp", 1, "Pending"))
    run(kube, clock)
    assert {shard_of(kube, f"camp-0000{i}")["status"]["phase"] for i in (0, 1)} == {"Paused"}
    assert names(kube, JOBS) == [] and len(names(kube)) == 2, "nothing new while suspended"
    status = status_of(kube)
    assert status["phase"] == "Suspended" and condition(status, "Suspended")["status"] == "True"

    kube.patch(CAMPAIGNS, NAMESPACE, "camp", {"spec": {"suspend": False}})
    run(kube, clock.advance(1))
    assert {shard_of(kube, f"camp-0000{i}")["status"]["phase"] for i in (0, 1)} == {"Pending"}
    assert shard_of(kube, "camp-00000")["status"]["attempt"] == 1


def test_budget_exhausted_pauses_and_is_not_a_failure(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": i} for i in range(3)], budget={"limit": 2}))
    put_shard(kube, shard("camp", 0, "Done", cost=2.5))
    put_shard(kube, shard("camp", 1, "Pending"))
    run(kube, clock)
    status = status_of(kube)
    assert shard_of(kube, "camp-00001")["status"]["phase"] == "Paused"
    assert status["phase"] == "Paused" and status["spent"] == 2.5
    assert condition(status, "BudgetExhausted")["status"] == "True"
    assert "BudgetExhausted" not in [c["type"] for c in status["conditions"] if c["status"] == "False"]
    assert names(kube) == ["camp-00000", "camp-00001"], "no new shards at the limit"


def test_work_that_does_not_fit_the_budget_is_held_said_and_started_by_a_higher_limit(
    kube: OperatorKube, clock: Clock
) -> None:
    """maxPerShard 2, spent 1.5 of 3: the next shard's reservation does not fit, nothing runs to free
    any. No worker starts; BudgetHeld says so with the fix (and an Event); raising the limit starts it."""
    put_campaign(kube, campaign(items=[{"id": i} for i in range(2)], budget={"limit": 3, "maxPerShard": 2}))
    put_shard(kube, shard("camp", 0, "Done", cost=1.5))
    put_shard(kube, shard("camp", 1, "Pending"))
    run(kube, clock)
    status = status_of(kube)
    assert names(kube, JOBS) == [], "no worker for work that may not start"
    held = condition(status, "BudgetHeld")
    assert (held["status"], held["reason"]) == ("True", "NoRoomForShard")
    assert (
        "raise spec.budget.limit above 3.5 to go on, or accept what is done: kubectl campaign cancel camp"
        in (held["message"])
    )
    assert status["phase"] == "Running" and condition(status, "BudgetWarning")["status"] == "False"
    assert kube.event_reasons("camp").count("NoRoomForShard") == 1
    run(kube, clock.advance(1))
    assert kube.event_reasons("camp").count("NoRoomForShard") == 1, "said once"

    kube.patch(CAMPAIGNS, NAMESPACE, "camp", {"spec": {"budget": {"limit": 4, "maxPerShard": 2}}})
    run(kube, clock.advance(1))
    assert len(names(kube, JOBS)) == 1
    assert (
        condition(status_of(kube), "BudgetHeld")["status"],
        condition(status_of(kube), "BudgetHeld")["reason"],
    ) == (
        "False",
        "NothingHeld",
    )


def test_work_left_at_the_warn_ratio_is_held_with_the_fix(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": i} for i in range(2)], budget={"limit": 4}))
    put_shard(kube, shard("camp", 0, "Done", cost=3.5))
    put_shard(kube, shard("camp", 1, "Pending"))
    run(kube, clock)
    status = status_of(kube)
    held = condition(status, "BudgetHeld")
    assert (held["status"], held["reason"]) == ("True", "WarnRatioReached")
    assert "1 work shard(s) left wait; raise spec.budget.limit above 4.375 to go on" in held["message"]
    assert condition(status, "BudgetWarning")["status"] == "True"
    # The warn ratio's own Event says it; BudgetHeld adds no second one with the same reason.
    assert kube.event_reasons("camp").count("WarnRatioReached") == 1


def test_finalize_shard_starts_only_when_the_work_is_terminal(kube: OperatorKube, clock: Clock) -> None:
    finalize = {"image": "img", "command": ["merge"]}
    put_campaign(kube, campaign(items=[{"id": 0}, {"id": 1}], finalize=finalize))
    put_shard(kube, shard("camp", 0, "Done"))
    put_shard(kube, shard("camp", 1, "Running", owner="w"))
    put_lease(kube, "camp-00001", "w", T0)
    run(kube, clock)
    assert "camp-finalize" not in names(kube)
    assert status_of(kube)["phase"] == "Running"

    kube.patch(SHARDS, NAMESPACE, "camp-00001", {"status": {"phase": "Failed"}}, subresource="status")
    run(kube, clock.advance(1))
    final = shard_of(kube, "camp-finalize")
    assert final["spec"]["shardClass"] == "finalize" and final["status"]["phase"] == "Pending"
    assert status_of(kube)["phase"] == "Finalizing"
    (job,) = kube.list(JOBS, NAMESPACE)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "img"

    kube.patch(SHARDS, NAMESPACE, "camp-finalize", {"status": {"phase": "Done"}}, subresource="status")
    run(kube, clock.advance(1))
    status = status_of(kube)
    assert status["phase"] == "Completed", "one work shard failed"
    assert status["failedShards"] == ["camp-00001"] and status["progressText"] == "2/3"


def test_all_done_succeeds_with_exact_counts(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": i} for i in range(4)], shardSize=2))
    put_shard(kube, shard("camp", 0, "Done", items=[{"id": 0}, {"id": 1}], cost=1.0))
    put_shard(kube, shard("camp", 1, "Done", items=[{"id": 2}, {"id": 3}], cost=0.5))
    run(kube, clock)
    status = status_of(kube)
    assert status["phase"] == "Succeeded" and condition(status, "Complete")["reason"] == "Succeeded"
    assert status["counts"] == {
        "queued": 0, "pending": 0, "running": 0, "done": 2, "failed": 0, "blocked": 0,
        "paused": 0, "total": 2, "materialized": 2,
    }  # fmt: skip
    assert status["spent"] == 1.5 and status["itemsTotal"] == 4
    assert names(kube, JOBS) == []


# --- breakers ---------------------------------------------------------------------------------------------


def _failed(index: int, seconds: float, source: str, cls: str) -> dict:
    at = T0.replace(second=int(seconds))
    return shard(
        "camp",
        index,
        "Pending",
        attempt=2,
        history=[
            entry("Pending", T0, "Materialized"),
            entry("Running", at, "Claimed", source=source),
            entry("Pending", at, "AttemptFailed", source=source, errorClass=cls),
        ],
        items=[{"id": index, "source": "A"}],
    )


def test_three_rate_limited_failures_open_the_breaker(kube: OperatorKube, clock: Clock) -> None:
    sources = [{"name": "A", "fallback": "B", "cooldownSeconds": 60}, {"name": "B"}]
    put_campaign(kube, campaign(items=[{"id": i, "source": "A"} for i in range(3)], sources=sources))
    for index in range(3):
        put_shard(kube, _failed(index, 10 + index, "A", "rate-limited"))
    run(kube, clock.advance(30))
    breakers = {b["source"]: b for b in status_of(kube)["breakers"]}
    assert breakers["A"]["state"] == "Open" and breakers["A"]["consecutiveFailures"] == 3
    assert breakers["B"]["state"] == "Closed"
    assert "BreakerOpened" in kube.event_reasons("camp")
    assert condition(status_of(kube), "BreakerOpen")["status"] == "True"
    # Folded once: the next pass does not count the same failures again.
    run(kube, clock.advance(1))
    assert {b["source"]: b for b in status_of(kube)["breakers"]}["A"]["consecutiveFailures"] == 3
    assert kube.event_reasons("camp").count("BreakerOpened") == 1


def test_other_failure_classes_do_not_trip_the_breaker(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": i, "source": "A"} for i in range(3)], sources=[{"name": "A"}]))
    for index in range(3):
        put_shard(kube, _failed(index, 10 + index, "A", "timeout"))
    run(kube, clock.advance(30))
    assert status_of(kube)["breakers"][0]["state"] == "Closed"


# --- workers -------------------------------------------------------------------------------------------


def test_worker_pods_stuck_pending_stop_new_jobs_and_say_why(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": i} for i in range(3)], maxConcurrency=3))
    kube.put(
        JOBS,
        NAMESPACE,
        {
            "metadata": {
                "name": "camp-worker-1",
                "labels": {"shardops.dev/campaign": "camp", "shardops.dev/role": "worker"},
            },
            "status": {},
        },
    )
    kube.put(
        PODS,
        NAMESPACE,
        {
            "metadata": {
                "name": "camp-worker-1-x",
                "labels": {
                    "shardops.dev/campaign": "camp",
                    "shardops.dev/role": "worker",
                    "job-name": "camp-worker-1",
                },
            },
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            },
        },
    )
    run(kube, clock)
    assert names(kube, JOBS) == ["camp-worker-1"]
    full = condition(status_of(kube), "ClusterFull")
    assert full["status"] == "True" and "stuck Pending" in full["message"]
    assert "WorkerPodsPending" in kube.event_reasons("camp")


def test_failing_workers_are_not_replaced_every_pass(kube: OperatorKube, clock: Clock) -> None:
    put_campaign(kube, campaign(items=[{"id": i} for i in range(3)], maxConcurrency=2))
    labels = {"shardops.dev/campaign": "camp", "shardops.dev/role": "worker"}
    for index in range(3):
        failed = {
            "type": "Failed",
            "status": "True",
            "lastTransitionTime": T0.isoformat(),
            "reason": "BackoffLimitExceeded",
        }
        kube.put(
            JOBS,
            NAMESPACE,
            {"metadata": {"name": f"old-{index}", "labels": labels}, "status": {"conditions": [failed]}},
        )
    run(kube, clock.advance(5))
    assert len(names(kube, JOBS)) == 3, "held back"
    failing = condition(status_of(kube), "WorkersFailing")
    assert failing["status"] == "True" and "3 worker Job(s) failed" in failing["message"]
    run(kube, clock.advance(60))
    assert len(names(kube, JOBS)) == 5, "quiet for a minute: try again"
    assert condition(status_of(kube), "WorkersFailing")["status"] == "False"


# --- gone campaigns ----------------------------------------------------------------------------------


def test_a_pass_says_whether_the_campaign_is_still_there(kube: OperatorKube, clock: Clock) -> None:
    """The periodic tick forgets a Campaign when a pass answers False: gone, or being deleted."""
    operator = reconciler(kube, clock, min_reconcile_interval_seconds=0)
    put_campaign(kube, campaign())
    assert operator.kick(NAMESPACE, "camp") is True and names(kube) != []
    deleting = campaign()
    deleting["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    put_campaign(kube, deleting)
    writes = len(kube.writes())
    assert operator.kick(NAMESPACE, "camp") is False
    assert len(kube.writes()) == writes, "nothing is done for a Campaign being deleted"
    assert operator.kick(NAMESPACE, "never-was") is False
    assert operator.reconcile(NAMESPACE, "never-was") is False


def test_a_worker_pod_that_cannot_start_turns_workers_failing_with_its_reason(
    kube: OperatorKube, clock: Clock
) -> None:
    """The pod of the campaign's only worker waits in CreateContainerConfigError: not healthy, not a
    full cluster; the condition carries the kubelet's own reason and message."""
    put_campaign(kube, campaign(items=[{"id": i} for i in range(3)], maxConcurrency=1))
    labels = {"shardops.dev/campaign": "camp", "shardops.dev/role": "worker"}
    kube.put(JOBS, NAMESPACE, {"metadata": {"name": "camp-worker-1", "labels": labels}, "status": {}})
    waiting = {"reason": "CreateContainerConfigError", "message": 'secret "shardops-s3" not found'}
    kube.put(
        PODS,
        NAMESPACE,
        {
            "metadata": {"name": "camp-worker-1-x", "labels": {**labels, "job-name": "camp-worker-1"}},
            "status": {
                "phase": "Pending",
                "containerStatuses": [{"name": "worker", "state": {"waiting": waiting}}],
            },
        },
    )
    run(kube, clock)
    failing = condition(status_of(kube), "WorkersFailing")
    assert failing["status"] == "True", failing
    assert 'CreateContainerConfigError: secret "shardops-s3" not found' in failing["message"]
    assert "camp-worker-1-x" in failing["message"]
    assert condition(status_of(kube), "ClusterFull")["status"] == "False"
    assert names(kube, JOBS) == ["camp-worker-1"]
