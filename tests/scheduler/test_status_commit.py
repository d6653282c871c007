"""What a pass remembers and announces follows the campaign-status write that records it.

A pass folds shard history into breakers, acts on a retry request and finds stalls; each of these is
recorded by the campaign-status write at the end of the pass. When that write loses (409: someone
changed the Campaign meanwhile) or never happens (an error, the leader gone), the pass must leave
nothing behind that the status does not say: no memory advanced past it, no Event announcing it,
no counter counted, and a retry request applied again must not retry a shard twice.
"""

from __future__ import annotations

import datetime as dt

import pytest

from shardops.api.store import resolve_result_store
from shardops.k8s.api import EVENTS, SHARDS, ApiError, Resource
from shardops.scheduler.reconcile import CONFLICT_ROUNDS
from tests.schedulerkit import (
    NAMESPACE,
    T0,
    Clock,
    OperatorKube,
    campaign,
    condition,
    conflict_status_writes,
    entry,
    fail_status_writes,
    is_status_write,
    put_campaign,
    put_lease,
    put_shard,
    reconciler,
    settings,
    shard,
    shard_of,
    status_of,
)

SOURCES = [{"name": "A", "fallback": "B", "cooldownSeconds": 60}, {"name": "B"}]


def put_recorded(kube: OperatorKube, body: dict) -> None:
    """The Campaign as a first pass leaves it: its result store fixed in the status, so the writes
    under test are the end-of-pass status writes."""
    store = resolve_result_store(None, settings().result_store_location())
    put_campaign(kube, {**body, "status": {"resultStore": store.to_dict()}})


def _rate_limited(index: int, second: int) -> dict:
    at = T0.replace(second=second)
    return shard(
        "camp",
        index,
        "Pending",
        attempt=2,
        history=[
            entry("Pending", T0, "Materialized"),
            entry("Running", at, "Claimed", source="A"),
            entry("Pending", at, "AttemptFailed", source="A", errorClass="rate-limited"),
        ],
        items=[{"id": index, "source": "A"}],
    )


def _breaker_campaign(kube: OperatorKube) -> None:
    put_recorded(kube, campaign(items=[{"id": i, "source": "A"} for i in range(3)], sources=SOURCES))
    for index in range(3):
        put_shard(kube, _rate_limited(index, 10 + index))


def breakers(kube: OperatorKube) -> dict[str, dict]:
    return {b["source"]: b for b in status_of(kube).get("breakers") or []}


# --- the breaker fold ------------------------------------------------------------------------------------


def test_a_status_write_that_conflicts_keeps_the_breaker_fold(kube: OperatorKube, clock: Clock) -> None:
    _breaker_campaign(kube)
    lost = conflict_status_writes(kube, 1)
    operator = reconciler(kube, clock.advance(30))
    operator.reconcile(NAMESPACE, "camp")
    assert lost, "the first status write was made to lose"
    assert breakers(kube)["A"]["state"] == "Open" and breakers(kube)["A"]["consecutiveFailures"] == 3
    assert condition(status_of(kube), "BreakerOpen")["status"] == "True"
    assert kube.event_reasons("camp").count("BreakerOpened") == 1
    retries = operator.metrics.registry.get_sample_value(
        "shardops_retries_total", {"campaign": f"{NAMESPACE}/camp", "error_class": "rate-limited"}
    )
    assert retries == 3, "each failure counted once, not once per round"


def test_no_breaker_event_before_a_status_that_says_so(kube: OperatorKube, clock: Clock) -> None:
    _breaker_campaign(kube)
    conflict_status_writes(kube, CONFLICT_ROUNDS)
    operator = reconciler(kube, clock.advance(30))
    operator.reconcile(NAMESPACE, "camp")
    assert "breakers" not in status_of(kube) or breakers(kube)["A"]["state"] == "Closed"
    assert "BreakerOpened" not in kube.event_reasons("camp"), "announced, but the status says Closed"
    # The next pass, whose write lands, folds the same failures and announces them once.
    operator.reconcile(NAMESPACE, "camp")
    assert breakers(kube)["A"]["state"] == "Open" and breakers(kube)["A"]["consecutiveFailures"] == 3
    assert kube.event_reasons("camp").count("BreakerOpened") == 1


def test_a_status_write_that_errors_leaves_the_fold_to_the_next_pass(
    kube: OperatorKube, clock: Clock
) -> None:
    _breaker_campaign(kube)
    down = [True]

    def unavailable(fake: OperatorKube, verb: str, resource: Resource, name: str) -> None:
        if is_status_write(verb, resource) and down[0]:
            raise ApiError(503, "ServiceUnavailable", "etcd is down")

    kube.before.append(unavailable)
    operator = reconciler(kube, clock.advance(30))
    with pytest.raises(ApiError):
        operator.reconcile(NAMESPACE, "camp")
    assert "BreakerOpened" not in kube.event_reasons("camp")
    down[0] = False
    operator.reconcile(NAMESPACE, "camp")
    assert breakers(kube)["A"]["state"] == "Open"
    assert kube.event_reasons("camp").count("BreakerOpened") == 1


# --- stalls ------------------------------------------------------------------------------------------------


def test_a_stall_is_announced_once_after_the_status_that_records_it(kube: OperatorKube, clock: Clock) -> None:
    put_recorded(kube, campaign(items=[{"id": 0}], stall={"policy": "Report", "heartbeats": 2}))
    claimed = entry("Running", T0, "Claimed", 1, owner="w1")
    put_shard(
        kube,
        shard(
            "camp",
            0,
            "Running",
            owner="w1",
            history=[entry("Pending", T0, "Materialized"), claimed],
            progress={"done": 0, "total": 1},
        ),
    )
    operator = reconciler(kube, clock)
    operator.reconcile(NAMESPACE, "camp")
    clock.advance(30)
    beat = {
        "status": {
            "lastHeartbeat": clock.now.isoformat(),
            "leaseUntil": (clock.now + dt.timedelta(seconds=30)).isoformat(),
        }
    }
    kube.patch(SHARDS, NAMESPACE, "camp-00000", beat, subresource="status")
    put_lease(kube, "camp-00000", "w1", clock.now, seconds=30)
    conflict_status_writes(kube, CONFLICT_ROUNDS)
    operator.reconcile(NAMESPACE, "camp")
    assert "Stalled" not in kube.event_reasons("camp"), "announced before any status said so"
    operator.reconcile(NAMESPACE, "camp")
    assert condition(status_of(kube), "Stalled")["status"] == "True"
    assert kube.event_reasons("camp").count("Stalled") == 1
    operator.reconcile(NAMESPACE, "camp")
    assert kube.event_reasons("camp").count("Stalled") == 1


# --- retry requests ------------------------------------------------------------------------------------


def _block_again(kube: OperatorKube, name: str, clock: Clock) -> None:
    """A worker claimed the retried shard and it gave up again (a poison item)."""
    stored = shard_of(kube, name)
    status = stored["status"]
    status["phase"] = "Blocked"
    status["attempt"] = 3
    status["history"] = [*status["history"], entry("Blocked", clock.now, "Blocked", 3)]
    kube.put(SHARDS, NAMESPACE, stored)


def _retried_count(kube: OperatorKube, name: str) -> int:
    return [h["reason"] for h in shard_of(kube, name)["status"]["history"]].count("Retried")


def test_a_retry_whose_status_write_conflicts_retries_each_shard_once(
    kube: OperatorKube, clock: Clock
) -> None:
    put_recorded(kube, campaign(items=[{"id": 0}], retry={"generation": 1}))
    put_shard(kube, shard("camp", 0, "Blocked", attempt=3))
    conflict_status_writes(kube, 1, then=[lambda: _block_again(kube, "camp-00000", clock)])
    reconciler(kube, clock).reconcile(NAMESPACE, "camp")
    assert _retried_count(kube, "camp-00000") == 1, "one retry request, one retry"
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Blocked"
    assert status_of(kube)["lastRetryGeneration"] == 1
    assert kube.event_reasons("camp").count("RetryStarted") == 1


def test_a_retry_cut_short_by_a_failover_is_not_applied_twice(kube: OperatorKube, clock: Clock) -> None:
    put_recorded(kube, campaign(items=[{"id": i} for i in range(2)], retry={"generation": 1}))
    put_shard(kube, shard("camp", 0, "Blocked", attempt=3))
    put_shard(kube, shard("camp", 1, "Failed"))

    fail_status_writes(kube, "the old leader's last write never lands")
    with pytest.raises(ApiError):
        reconciler(kube, clock).reconcile(NAMESPACE, "camp")
    kube.before.clear()
    assert "RetryStarted" not in kube.event_reasons("camp"), "nothing recorded the retry yet"
    _block_again(kube, "camp-00000", clock.advance(20))
    # A new leader (nothing in memory) finds spec.retry.generation still ahead of the status.
    reconciler(kube, clock.advance(1)).reconcile(NAMESPACE, "camp")
    assert _retried_count(kube, "camp-00000") == 1 and _retried_count(kube, "camp-00001") == 1
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Blocked", "not retried a second time"
    assert status_of(kube)["lastRetryGeneration"] == 1
    [note] = [e["note"] for e in kube.list(EVENTS, NAMESPACE) if e["reason"] == "RetryStarted"]
    assert "2 shard(s) back to Pending (camp-00000, camp-00001)" in note
