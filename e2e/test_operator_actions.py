"""Recorded actions on a campaign: suspend pauses claims and new workers without losing anything, and
unsuspend resumes. (Retrying Blocked shards is in test_operator_failures.)"""

from __future__ import annotations

import datetime as dt

import pytest
from testbed.harness import Cluster, wait_for
from testbed.kits.scheduler import (
    HOLD_WINDOW,
    STALE_READ_GRACE,
    campaign_body,
    condition,
    create_campaign,
    get_campaign,
    history,
    kube_for,
    operator_running,
    parse_time,
    patch_spec,
    phase_of,
    reasons,
    recording,
    shards_of,
    wait_phase,
)

pytestmark = pytest.mark.usefixtures("crds_installed")


def test_suspend_pauses_without_losing_anything_and_unsuspend_resumes(
    local_cluster: Cluster, namespace: str
) -> None:
    kube = kube_for(local_cluster)
    body = campaign_body(
        "pausable",
        [{"n": i} for i in range(12)],
        shardSize=1,
        maxConcurrency=2,
        worker_env={"SHARDOPS_AGENT_LATENCY": 1.0, "SHARDOPS_CLAIM_CANDIDATES": 1},
    )
    with (
        operator_running(local_cluster, namespace),
        recording(local_cluster, namespace, "campaigns", "jobs") as recorded,
    ):
        create_campaign(kube, namespace, body)
        wait_for(
            "two shards done",
            lambda: sum(1 for s in shards_of(kube, namespace) if phase_of(s) == "Done") >= 2,
            timeout=120,
        )
        patch_spec(kube, namespace, "pausable", {"suspend": True})
        suspended = wait_phase(kube, namespace, "pausable", {"Suspended"}, timeout=30)
        published = next(
            seen.wall
            for seen in recorded["campaigns"].events
            if (found := condition(seen.obj, "Suspended")) and found["status"] == "True"
        )

        def settled() -> dict | None:
            counts = get_campaign(kube, namespace, "pausable")["status"]["counts"]
            return counts if counts["running"] == 0 and counts["pending"] == 0 else None

        wait_for("running shards to finish and the rest to pause", settled, timeout=60)
        # An observation window, not a synchronization: nothing may start while suspended.
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=HOLD_WINDOW)
        wait_for("the hold window", lambda: dt.datetime.now(dt.UTC) >= deadline, timeout=HOLD_WINDOW + 5)
        held = get_campaign(kube, namespace, "pausable")
        shards = shards_of(kube, namespace)
        claims = [parse_time(e["at"]) for s in shards for e in history(s) if e["reason"] == "Claimed"]
        jobs_after = {
            seen.name
            for seen in recorded["jobs"].events
            if seen.type == "ADDED" and seen.wall > published + STALE_READ_GRACE
        }
        paused = sorted(s["metadata"]["name"] for s in shards if phase_of(s) == "Paused")

        assert suspended["status"]["phase"] == "Suspended"
        assert held["status"]["phase"] == "Suspended"
        assert all(at <= published + STALE_READ_GRACE for at in claims), (published, claims)
        assert jobs_after == set(), jobs_after
        assert paused, "unclaimed shards are Paused while suspended"
        assert {phase_of(s) for s in shards} <= {"Done", "Paused"}
        assert held["status"]["counts"]["paused"] == len(paused)

        patch_spec(kube, namespace, "pausable", {"suspend": False})
        final = wait_phase(kube, namespace, "pausable", {"Succeeded", "Completed"}, timeout=180)

    shards = shards_of(kube, namespace)
    assert final["status"]["phase"] == "Succeeded"
    assert condition(final, "Suspended")["status"] == "False"
    assert len(shards) == 12 and all(phase_of(s) == "Done" for s in shards)
    # Nothing lost or charged: each shard claimed and completed once, on attempt 1.
    assert all(reasons(s).count("Completed") == 1 and s["status"]["attempt"] == 1 for s in shards)
    for name in paused:
        shard = next(s for s in shards if s["metadata"]["name"] == name)
        assert "Paused" in reasons(shard) and "Resumed" in reasons(shard)
        assert reasons(shard).index("Resumed") > reasons(shard).index("Paused")
    print(
        f"\nsuspended with {12 - len(paused)} shard(s) done or running, {len(paused)} paused; "
        f"claims after the Suspended condition was published: {sum(1 for at in claims if at > published)}; "
        f"Jobs created while suspended: {len(jobs_after)}"
    )
