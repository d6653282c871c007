"""The lease sweep (scheduler/sweep.py), through the reconcile: expired claims back to Pending or
Done, stalls reported once, renewals judged on the operator's own clock."""

from __future__ import annotations

import datetime as dt

from shardops.k8s.api import (
    CAMPAIGNS,
    EVENTS,
    LEASES,
    SHARDS,
)
from tests.schedulerkit import (
    NAMESPACE,
    T0,
    Clock,
    OperatorKube,
    beat,
    campaign,
    condition,
    entry,
    put_campaign,
    put_lease,
    put_shard,
    reconciler,
    run,
    shard,
    shard_of,
    status_of,
    watching,
)


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
    # Counted in the campaign's LeaseExpired Event, the one the shard's history names.
    assert "LeaseExpired" in kube.event_reasons("camp") and s["history"][-1]["event"] == "camp.leaseexpired"


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
    from shardops.logic.idempotency import item_subkey
    from shardops.store.records import ResultMeta, encode_result
    from shardops.store.s3 import S3Store
    from tests.fakes3 import FakeS3

    put_campaign(kube, campaign(items=[{"id": 0}], maxAttempts=2))
    _running(kube, attempt=1, fencingToken=1)
    put_lease(kube, "camp-00000", "w1", T0, seconds=30)
    operator = reconciler(kube, clock, result_store="S3", s3_bucket="results")
    location = operator.settings.result_store_location()
    s3 = S3Store(location, NAMESPACE, client=FakeS3())
    operator.stores.use(NAMESPACE, location, s3)
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
    assert kube.event_reasons("camp").count("Stalled") == 1
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


# --- the stall clock, on its own --------------------------------------------------------------------


def test_the_stall_clock_starts_at_first_sight_and_restarts_when_progress_rises() -> None:
    from shardops.api.shard import Shard
    from shardops.scheduler.memory import Memory
    from shardops.scheduler.sweep import progress_mark

    memory = Memory()
    first = Shard.parse(shard("camp", 0, "Running", progress={"done": 1, "total": 4}))
    mark = progress_mark(memory, first, T0)
    assert (mark.attempt, mark.done, mark.changed_at) == (1, 1, T0)
    mark.reported = True
    later = T0 + dt.timedelta(seconds=60)
    assert progress_mark(memory, first, later).changed_at == T0, "no progress: the clock runs on"
    moved = Shard.parse(shard("camp", 0, "Running", progress={"done": 2, "total": 4}))
    again = progress_mark(memory, moved, later)
    assert (again.done, again.changed_at, again.reported) == (2, later, False)
    retried = Shard.parse(shard("camp", 0, "Running", attempt=2, progress={"done": 0, "total": 4}))
    assert progress_mark(memory, retried, later + dt.timedelta(seconds=1)).attempt == 2, "a new attempt"
