"""The campaign reconcile against an in-memory API server: what it creates, what it moves, what it writes."""

from __future__ import annotations

from shardops.k8s.api import (
    CAMPAIGNS,
    JOBS,
    PODS,
    SHARDS,
    SOURCES,
)
from tests.schedulerkit import (
    NAMESPACE,
    T0,
    Clock,
    OperatorKube,
    campaign,
    condition,
    entry,
    names,
    put_campaign,
    put_lease,
    put_shard,
    reconciler,
    run,
    shard,
    shard_of,
    status_of,
)

# --- invalid campaigns --------------------------------------------------------------------------------


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


# --- recorded actions, budget, suspend, finalize ---------------------------------------------------------


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
    assert status["phase"] == "Paused" and status["spent"] == "2.5"
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
    assert status["spent"] == "1.5" and status["itemsTotal"] == 4
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


# --- shared Sources -------------------------------------------------------------------------------------


def test_a_source_ref_naming_no_source_is_a_condition_and_an_event_until_it_is_created(
    kube: OperatorKube, clock: Clock
) -> None:
    put_campaign(kube, campaign(sources=[{"name": "llm", "sourceRef": {"name": "team-openai"}}]))
    operator = reconciler(kube, clock)
    operator.reconcile(NAMESPACE, "camp")  # reports its claim
    operator.sharing.run({(NAMESPACE, "camp")}, clock.now)
    operator.reconcile(NAMESPACE, "camp")
    unresolved = condition(status_of(kube), "SourceUnresolved")
    assert (unresolved["status"], unresolved["reason"]) == ("True", "SourceNotFound")
    assert unresolved["message"].startswith(
        f"spec.sources[0].sourceRef: no Source team-openai in namespace {NAMESPACE}"
    )
    events = [e for (plural, _, _), e in kube.objects.items() if plural == "events"]
    assert [(e["reason"], e["type"]) for e in events] == [("SourceNotFound", "Warning")]
    assert "spec.sources[0].sourceRef" in events[0]["note"]
    kube.put(
        SOURCES,
        NAMESPACE,
        {
            "apiVersion": "shardops.dev/v1alpha1",
            "kind": "Source",
            "metadata": {"name": "team-openai"},
            "spec": {"baseUrl": "http://upstream/v1", "model": "m"},
        },
    )
    operator.sharing.run({(NAMESPACE, "camp")}, clock.now)
    operator.reconcile(NAMESPACE, "camp")
    resolved = condition(status_of(kube), "SourceUnresolved")
    assert (resolved["status"], resolved["reason"]) == ("False", "SourcesResolved")
