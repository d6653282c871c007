"""A recorded retry request (scheduler/retry.py), through the reconcile: acted on once, only on
the shards it lists, with the skipped ones named."""

from __future__ import annotations

from shardops.k8s.api import (
    EVENTS,
    LEASES,
)
from tests.schedulerkit import (
    NAMESPACE,
    T0,
    Clock,
    OperatorKube,
    campaign,
    condition,
    put_campaign,
    put_lease,
    put_shard,
    run,
    shard,
    shard_of,
    status_of,
)


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


def test_a_retry_of_the_errored_items_sends_the_live_done_shards_with_errors_back_once(
    kube: OperatorKube, clock: Clock
) -> None:
    """spec.retry.errored: a live Done shard with errored items goes back to Pending with
    status.rerunErrored, its result kept (the worker reads the others' from it) and its Lease freed
    (a Done shard's holder keeps it); a Done shard without errors and a Failed one are left alone."""
    put_campaign(
        kube, campaign(items=[{"id": i} for i in range(3)], retry={"generation": 1, "errored": True})
    )
    result = {"ref": "camp-r0", "fingerprint": "sha256:" + "0" * 64, "bytes": 10}
    put_shard(kube, shard("camp", 0, "Done", result=result, progress={"done": 1, "total": 1, "errored": 1}))
    put_shard(kube, shard("camp", 1, "Done", result=result, progress={"done": 1, "total": 1}))
    put_shard(kube, shard("camp", 2, "Failed"))
    put_lease(kube, "camp-00000", "worker-a", T0)
    run(kube, clock)
    s = shard_of(kube, "camp-00000")["status"]
    assert (s["phase"], s["attempt"], s["rerunErrored"], s["result"]) == ("Pending", 1, True, result)
    assert (kube.obj(LEASES, NAMESPACE, "camp-00000") or {})["spec"].get("holderIdentity") is None
    assert shard_of(kube, "camp-00001")["status"]["phase"] == "Done"
    assert shard_of(kube, "camp-00002")["status"]["phase"] == "Failed"
    assert status_of(kube)["lastRetryGeneration"] == 1
    run(kube, clock.advance(1))
    [event] = [e for e in kube.list(EVENTS, NAMESPACE) if e["reason"] == "RetryStarted"]
    assert (
        "(errored items): 1 Done shard(s) back to Pending to run their errored items (camp-00000)"
        in event["note"]
    )
    history = [h["reason"] for h in shard_of(kube, "camp-00000")["status"]["history"]]
    assert history.count("ErroredRetried") == 1
