"""Planning and carrying the plan out (scheduler/dispatch.py), through the reconcile: shards cut
within the backlog bound, their Pending writes, worker Jobs started, numbered and held back."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from shardops.api.common import JSON
from shardops.k8s import jobs
from shardops.k8s.api import (
    JOBS,
    PODS,
    SHARDS,
    AlreadyExists,
    ApiError,
    Resource,
)
from tests.schedulerkit import (
    NAMESPACE,
    T0,
    Clock,
    OperatorKube,
    campaign,
    condition,
    names,
    put_campaign,
    put_lease,
    put_shard,
    run,
    shard,
    shard_of,
    status_of,
)


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
