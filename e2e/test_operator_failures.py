"""Failures: a killed worker's shard is reclaimed once its lease expires; retryable failures back off
and block; non-retryable ones fail at once; a retry of what gave up is an explicit, recorded action."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from kubernetes import client
from testbed.bed import Bed
from testbed.harness import Cluster

from shardops.k8s.api import EVENTS, LEASES, SHARDS, NotFound
from shardops.k8s.events import occurrences, series_name
from shardops.logic.backoff import backoff_bounds

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")


def _running_worker_pid(cluster: Cluster, namespace: str, campaign: str) -> tuple[str, int] | None:
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(
        namespace, label_selector=f"shardops.dev/campaign={campaign}"
    )
    for pod in pods.items:
        for status in pod.status.container_statuses or []:
            if status.state and status.state.running and status.container_id:
                return pod.metadata.name, int(status.container_id.removeprefix("process://"))
    return None


def test_killed_worker_shard_is_reclaimed_after_lease_expiry_and_finishes_once(
    bed: Bed, tmp_path: Path
) -> None:
    kube = bed.kube
    ledger = tmp_path / "ledger.jsonl"
    body = bed.campaign_body(
        "crash",
        [{"n": i} for i in range(6)],
        shardSize=6,
        maxConcurrency=1,
        worker_env={"SHARDOPS_AGENT_LATENCY": 1.0, "SHARDOPS_AGENT_LEDGER": ledger},
    )
    shard_name = "crash-00000"
    with bed.operator():
        bed.create_campaign(body)

        def progressed() -> bool:
            try:
                status = kube.get(SHARDS, bed.namespace, shard_name).get("status") or {}
            except NotFound:
                return False
            done = (status.get("progress") or {}).get("done", 0)
            return status.get("phase") == "Running" and done >= 2

        bed.wait_for("the shard to run with 2 items stored", progressed, timeout=120)
        pod, pid = bed.wait_for(
            "the worker process", lambda: _running_worker_pid(bed.cluster, bed.namespace, "crash")
        )
        bed.kill_group(pid)
        lease = kube.get(LEASES, bed.namespace, shard_name)
        last_renewal = bed.parse_time(lease["spec"]["renewTime"])

        final = bed.wait_phase("crash", {"Succeeded", "Completed"}, timeout=180)

    shard = kube.get(SHARDS, bed.namespace, shard_name)
    entries = bed.history(shard)
    expired = [e for e in entries if e["reason"] == "LeaseExpired"]
    claims = [e for e in entries if e["reason"] == "Claimed"]
    assert final["status"]["phase"] == "Succeeded"
    assert len(expired) == 1, bed.reasons(shard)
    assert [c["attempt"] for c in claims] == [1, 2], bed.reasons(shard)
    assert shard["status"]["attempt"] == 2
    assert bed.reasons(shard).count("Completed") == 1
    # Reclaimed only after the lease ran out, never while it could still be renewed.
    reclaimed_at = bed.parse_time(expired[0]["at"])
    assert (reclaimed_at - last_renewal).total_seconds() >= bed.LEASE_SECONDS
    # Counted in the campaign's one LeaseExpired Event (no Event per shard), which the entry names.
    assert expired[0]["event"] == series_name("crash", "LeaseExpired"), expired[0]
    (event,) = bed.wait_campaign_events("crash", "LeaseExpired", 1)
    assert event["metadata"]["name"] == expired[0]["event"] and occurrences(event) == 1, event
    assert shard_name in event["note"], event["note"]
    reclaimer = event["reportingController"]

    # One result, not two: the key's committed result is the one the shard's Done write recorded.
    committed = bed.committed_result(shard)
    assert shard["status"]["result"]["ref"] == committed.name
    calls = Counter(
        (line["index"], line["attempt"])
        for line in map(json.loads, ledger.read_text().splitlines())
        if line["event"] == "done"
    )
    per_item = Counter(index for index, _ in calls)
    recomputed = sorted(index for index, n in per_item.items() if n > 1)
    print(
        f"\nworker {pod} killed; lease expired {(reclaimed_at - last_renewal).total_seconds():.1f}s after "
        "its "
        f"last renewal (leaseSeconds {bed.LEASE_SECONDS}), reclaimed by {reclaimer}; attempt 2 finished; "
        "item calls by (index, attempt): "
        f"{dict(sorted(calls.items()))}; recomputed after the kill: {recomputed}"
    )
    assert set(per_item) == set(range(6))
    # Items stored before the kill are not called again; only those after the last flush may be.
    assert len(recomputed) <= 2


def test_retryable_failures_back_off_then_block_non_retryable_fail_at_once_and_retry_is_explicit(
    bed: Bed,
) -> None:
    kube = bed.kube
    base, cap = 1.0, 8.0
    flaky = bed.campaign_body(
        "flaky",
        [{"q": "slow upstream", "source": "A"}],
        shardSize=1,
        maxAttempts=3,
        backoff={"baseSeconds": base, "capSeconds": cap},
        sources=[{"name": "A"}],
        worker_env={"SHARDOPS_AGENT_TIMEOUT_SOURCES": "A"},
    )
    poison = bed.campaign_body("poison", [{"q": "bad", "fault": "invalid"}], shardSize=1, maxAttempts=3)
    with (
        bed.operator(),
        bed.recording("shards") as recorded,
    ):
        bed.create_campaign(flaky)
        bed.create_campaign(poison)
        blocked_campaign = bed.wait_phase("flaky", {"Completed", "Succeeded"}, timeout=120)
        failed_campaign = bed.wait_phase("poison", {"Completed", "Succeeded"}, timeout=120)

        blocked = kube.get(SHARDS, bed.namespace, "flaky-00000")
        failed = kube.get(SHARDS, bed.namespace, "poison-00000")

        # Retryable: three claims, backoff between them within min(base*2^(n-1), cap)*[0.5, 1].
        assert bed.phase_of(blocked) == "Blocked"
        assert bed.reasons(blocked).count("Claimed") == 3
        assert bed.reasons(blocked).count("AttemptFailed") == 2 and bed.reasons(blocked)[-1] == "Blocked"
        delays = _backoff_delays(recorded["shards"].events, "flaky-00000")
        assert [attempt for attempt, _ in delays] == [1, 2]
        for attempt, delay in delays:
            low, high = backoff_bounds(attempt, base, cap)
            assert low - 0.01 <= delay <= high + 0.01, (attempt, delay, low, high)
        claim_times = [bed.parse_time(e["at"]) for e in bed.history(blocked) if e["reason"] == "Claimed"]
        failure_times = [
            bed.parse_time(e["at"]) for e in bed.history(blocked) if e["reason"] == "AttemptFailed"
        ]
        waits = [
            (claim - fail).total_seconds() for fail, claim in zip(failure_times, claim_times[1:], strict=True)
        ]
        assert all(w >= d - 0.05 for w, (_, d) in zip(waits, delays, strict=True)), (waits, delays)
        error = blocked["status"]["lastError"]
        assert error["class"] == "timeout" and error["source"] == "A"
        # The campaign's one Event per reason counts them: two failed attempts, one shard blocked.
        assert error["event"] == series_name("flaky", "Blocked"), error
        (event,) = bed.wait_campaign_events("flaky", "Blocked", 1)
        assert event["metadata"]["name"] == error["event"] and occurrences(event) == 1, event
        assert "flaky-00000" in event["note"], event["note"]
        (attempts,) = bed.campaign_events("flaky", "AttemptFailed")
        assert occurrences(attempts) == 2, attempts

        # Non-retryable: failed on its first attempt, never claimed again.
        assert bed.phase_of(failed) == "Failed"
        assert bed.reasons(failed) == ["Materialized", "Claimed", "Failed"]
        assert failed["status"]["attempt"] == 1 and failed["status"]["lastError"]["class"] == "invalid-input"

        # The campaigns are finished, not succeeded, and say which shards gave up.
        for finished, name in ((blocked_campaign, "flaky-00000"), (failed_campaign, "poison-00000")):
            degraded = bed.condition(finished, "Degraded")
            assert finished["status"]["phase"] == "Completed"
            assert degraded is not None and degraded["status"] == "True" and name in degraded["message"]
        assert blocked_campaign["status"]["blockedShards"] == ["flaky-00000"]
        assert failed_campaign["status"]["failedShards"] == ["poison-00000"]

        # The upstream is fixed; retrying is one recorded request on the campaign, not a shard edit.
        bed.patch_spec(
            "flaky",
            {"retry": {"generation": 1}, "worker": {**flaky["spec"]["worker"], "env": []}},
        )
        retried = bed.wait_phase("flaky", {"Succeeded"}, timeout=120)
        shard = kube.get(SHARDS, bed.namespace, "flaky-00000")
        assert retried["status"]["lastRetryGeneration"] == 1
        assert bed.reasons(shard)[-3:] == ["Retried", "Claimed", "Completed"]
        assert shard["status"]["attempt"] == 1
        retry_events = [
            e
            for e in kube.list(EVENTS, bed.namespace)
            if e["reason"] == "RetryStarted" and e["regarding"]["name"] == "flaky"
        ]
        assert len(retry_events) == 1, retry_events
        (retried_event,) = bed.wait_campaign_events("flaky", "Retried", 1)
        assert occurrences(retried_event) == 1, retried_event
        # Acted on once: later passes leave the shard alone.
        assert bed.get_campaign("flaky")["status"]["lastRetryGeneration"] == 1
        assert bed.reasons(kube.get(SHARDS, bed.namespace, "flaky-00000")).count("Retried") == 1
    print(
        f"\nbackoff delays by attempt (base {base}s, cap {cap}s): {delays}; "
        f"waits before the next claim: {waits}"
    )


def _backoff_delays(events: list, shard: str) -> list[tuple[int, float]]:
    """(attempt, notBefore - failure time) for each AttemptFailed, from the versions the watch saw."""
    found: dict[int, float] = {}
    for seen in events:
        if seen.name != shard:
            continue
        status = seen.obj.get("status") or {}
        entries = status.get("history") or []
        if not entries or entries[-1]["reason"] != "AttemptFailed" or not status.get("notBefore"):
            continue
        entry = entries[-1]
        delay = (Bed.parse_time(status["notBefore"]) - Bed.parse_time(entry["at"])).total_seconds()
        found.setdefault(int(entry["attempt"]), delay)
    return sorted(found.items())
