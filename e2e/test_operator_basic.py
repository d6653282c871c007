"""The scheduler end to end: a campaign runs to Succeeded under its concurrency cap, once per shard."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from testbed.bed import Bed

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")


def test_forty_items_in_eight_shards_never_more_than_three_running(bed: Bed) -> None:
    items = [{"n": i} for i in range(40)]
    body = bed.campaign_body(
        "forty",
        items,
        shardSize=5,
        maxConcurrency=3,
        worker_env={"SHARDOPS_AGENT_LATENCY": 0.15, "SHARDOPS_AGENT_COST": 0.25},
    )
    with (
        bed.operator() as operator,
        bed.recording("shards", "jobs") as recorded,
    ):
        bed.create_campaign(body)
        final = bed.wait_phase("forty", {"Succeeded", "Completed", "Paused"}, timeout=240)
        status = final["status"]

        shards = bed.shards()
        assert status["phase"] == "Succeeded", status
        assert sorted(s["metadata"]["name"] for s in shards) == [f"forty-{i:05d}" for i in range(8)]
        assert all(bed.phase_of(s) == "Done" for s in shards)
        # Exactly once: one claim and one completion per shard, all on the first attempt.
        assert all(
            bed.reasons(s).count("Claimed") == 1 and bed.reasons(s).count("Completed") == 1 for s in shards
        )
        assert {s["status"]["attempt"] for s in shards} == {1}

        counts = status["counts"]
        assert counts == {
            "queued": 0,
            "pending": 0,
            "running": 0,
            "done": 8,
            "failed": 0,
            "blocked": 0,
            "paused": 0,
            "total": 8,
            "materialized": 8,
        }
        assert (status["itemsTotal"], status["shardsTotal"], status["progressText"]) == (40, 8, "8/8")
        assert status["spent"] == "10", status["spent"]  # 40 costs of 0.25, exactly
        assert status["observedGeneration"] == final["metadata"]["generation"]
        assert bed.condition(final, "Complete")["status"] == "True"
        assert bed.condition(final, "Ready")["status"] == "True"

        # Never more than 3 running: from every shard's own history (each attempt from its claim to
        # whatever ended it), and from every version of every shard the watch delivered.
        history_peak = bed.max_overlap(bed.running_intervals(shards))
        recorded["shards"].check()
        watched_peak = max(bed.phase_counts(state)["Running"] for _, state in recorded["shards"].states())
        alive_jobs_peak = max(
            sum(1 for job in state.values() if not _finished(job)) for _, state in recorded["jobs"].states()
        )
        jobs_created = len({seen.name for seen in recorded["jobs"].events})
        print(
            f"\nmax running: {history_peak} by shard history, {watched_peak} by watch; "
            f"max live worker Jobs: {alive_jobs_peak}; Jobs created: {jobs_created}"
        )
        assert history_peak <= 3 and watched_peak <= 3 and alive_jobs_peak <= 3

        healthz = operator.http("/healthz")
        metrics = operator.http("/metrics")[1]
        assert healthz[0] == 200, healthz
        key = f'campaign="{bed.namespace}/forty"'
        assert f'shardops_shards{{{key},phase="Done"}} 8.0' in metrics
        assert "shardops_reconcile_duration_seconds_count" in metrics
        assert 'shardops_api_requests_total{code="200",verb="GET"}' in metrics
        assert f"shardops_claims_total{{{key}}} 8.0" in metrics

    entries = bed.audit_entries()
    per_shard = bed.writes_by_shard(entries, shards)
    assert set(per_shard) == {s["metadata"]["name"] for s in shards}
    transitions = {s["metadata"]["name"]: bed.worker_transitions(s) for s in shards}
    figures = bed.print_writes_table("40 items / 8 shards", per_shard, transitions)
    assert figures.without_heartbeats > 0
    # Writes that belong to the campaign rather than to one shard, for scale.
    campaign_writes = Counter(
        f"{e['user']['username'].rsplit(':', 1)[-1]} {e['verb']} {e['objectRef']['resource']}"
        + (f"/{e['objectRef']['subresource']}" if e["objectRef"].get("subresource") else "")
        for e in entries
        if e["verb"] in ("create", "patch", "update")
        and 200 <= (e.get("responseStatus") or {}).get("code", 0) < 300
        and e["objectRef"].get("resource") in ("campaigns", "jobs")
    )
    print(f"  campaign-level writes over the whole run: {dict(sorted(campaign_writes.items()))}")


def test_a_campaign_whose_spec_fills_most_of_the_annotation_limit_runs_applied_with_kubectl(bed: Bed) -> None:
    """Applied as users apply (`kubectl apply`, whose own annotation holds the whole object), a
    Campaign of ~150 KB of inline items: the operator keeps no second copy of its spec (kopf's change
    handlers would, in an annotation, and the two together pass the 256 KiB limit: each write of
    kopf's would be refused). It runs to Succeeded, and its status writes carry the spec once."""
    items = [{"n": i, "text": f"{i:06d}-" + "x" * 90} for i in range(1500)]
    body = bed.campaign_body("wide", items, shardSize=500, maxConcurrency=3)
    manifest = json.dumps(body)
    assert 128 * 1024 < len(manifest) < 256 * 1024, len(manifest)
    with bed.operator() as operator:
        bed.cluster.kubectl("apply", "-n", bed.namespace, "-f", "-", stdin=manifest)
        final = bed.wait_phase("wide", {"Succeeded", "Completed", "Paused"}, timeout=240)
        assert final["status"]["phase"] == "Succeeded", final["status"]
        assert final["status"]["progressText"] == "3/3"
        annotations = final["metadata"].get("annotations") or {}
        assert "kubectl.kubernetes.io/last-applied-configuration" in annotations
        ours = [key for key in annotations if key.startswith("shardops.dev/")]
        assert ours == [], ours
        logs = "\n".join(operator.log(pod.metadata.name) for pod in operator.pods())
        assert "Too long" not in logs and "must have at most" not in logs


def _finished(job: dict) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions)
