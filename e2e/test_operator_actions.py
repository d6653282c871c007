"""Recorded actions on a campaign: suspend pauses claims and new workers without losing anything, and
unsuspend resumes. (Retrying Blocked shards is in test_operator_failures.)"""

from __future__ import annotations

import datetime as dt

import pytest
from testbed.bed import Bed

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")


def test_suspend_pauses_without_losing_anything_and_unsuspend_resumes(bed: Bed) -> None:
    body = bed.campaign_body(
        "pausable",
        [{"n": i} for i in range(12)],
        shardSize=1,
        maxConcurrency=2,
        worker_env={"SHARDOPS_AGENT_LATENCY": 1.0, "SHARDOPS_CLAIM_CANDIDATES": 1},
    )
    with (
        bed.operator(),
        bed.recording("campaigns", "jobs") as recorded,
    ):
        bed.create_campaign(body)
        bed.wait_for(
            "two shards done",
            lambda: sum(1 for s in bed.shards() if bed.phase_of(s) == "Done") >= 2,
            timeout=120,
        )
        bed.patch_spec("pausable", {"suspend": True})
        suspended = bed.wait_phase("pausable", {"Suspended"}, timeout=30)
        published = next(
            seen.wall
            for seen in recorded["campaigns"].events
            if (found := bed.condition(seen.obj, "Suspended")) and found["status"] == "True"
        )

        def settled() -> dict | None:
            counts = bed.get_campaign("pausable")["status"]["counts"]
            return counts if counts["running"] == 0 and counts["pending"] == 0 else None

        bed.wait_for("running shards to finish and the rest to pause", settled, timeout=60)
        # An observation window, not a synchronization: nothing may start while suspended.
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=bed.HOLD_WINDOW)
        bed.wait_for(
            "the hold window", lambda: dt.datetime.now(dt.UTC) >= deadline, timeout=bed.HOLD_WINDOW + 5
        )
        held = bed.get_campaign("pausable")
        shards = bed.shards()
        claims = [bed.parse_time(e["at"]) for s in shards for e in bed.history(s) if e["reason"] == "Claimed"]
        jobs_after = {
            seen.name
            for seen in recorded["jobs"].events
            if seen.type == "ADDED" and seen.wall > published + bed.STALE_READ_GRACE
        }
        paused = sorted(s["metadata"]["name"] for s in shards if bed.phase_of(s) == "Paused")

        assert suspended["status"]["phase"] == "Suspended"
        assert held["status"]["phase"] == "Suspended"
        assert all(at <= published + bed.STALE_READ_GRACE for at in claims), (published, claims)
        assert jobs_after == set(), jobs_after
        assert paused, "unclaimed shards are Paused while suspended"
        assert {bed.phase_of(s) for s in shards} <= {"Done", "Paused"}
        assert held["status"]["counts"]["paused"] == len(paused)

        bed.patch_spec("pausable", {"suspend": False})
        final = bed.wait_phase("pausable", {"Succeeded", "Completed"}, timeout=180)

    shards = bed.shards()
    assert final["status"]["phase"] == "Succeeded"
    assert bed.condition(final, "Suspended")["status"] == "False"
    assert len(shards) == 12 and all(bed.phase_of(s) == "Done" for s in shards)
    # Nothing lost or charged: each shard claimed and completed once, on attempt 1.
    assert all(bed.reasons(s).count("Completed") == 1 and s["status"]["attempt"] == 1 for s in shards)
    for name in paused:
        shard = next(s for s in shards if s["metadata"]["name"] == name)
        assert "Paused" in bed.reasons(shard) and "Resumed" in bed.reasons(shard)
        assert bed.reasons(shard).index("Resumed") > bed.reasons(shard).index("Paused")
    print(
        f"\nsuspended with {12 - len(paused)} shard(s) done or running, {len(paused)} paused; "
        f"claims after the Suspended condition was published: {sum(1 for at in claims if at > published)}; "
        f"Jobs created while suspended: {len(jobs_after)}"
    )
