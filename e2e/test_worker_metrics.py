"""The worker runtime's own figures, scraped over HTTP from a real worker against the real API server.

A worker with the chart's RBAC runs a campaign of two one-item shards whose command outlasts a
heartbeat. Scraped while the first shard runs, /metrics shows the claim won and the heartbeat; when
the campaign is finished the worker lingers until a scrape has read its final figures, and those
agree with what the API server recorded (two shards Done, each claimed once by this worker). The
worker exits at that scrape, well before its linger time runs out.
"""

from __future__ import annotations

from pathlib import Path

from testbed.harness import Cluster
from testbed.kits import worker as kit

LATENCY = 2.5


def test_a_workers_metrics_are_scraped_while_it_runs_and_once_more_before_it_exits(
    local_cluster: Cluster, namespace: str, crds_installed: None, tmp_path: Path
) -> None:
    kube = kit.admin_kube(local_cluster)
    body = kit.campaign_body(
        "metered",
        [{"id": i} for i in range(2)],
        shard_size=1,
        lease_seconds=10,
        heartbeat_seconds=2,
        # Each command runs past the 2 s heartbeat: every shard heartbeats at least once.
        env={"SHARDOPS_AGENT_LATENCY": str(LATENCY)},
    )
    campaign = f"{namespace}/metered"
    with kit.worker_pool(local_cluster, namespace, tmp_path) as pool:
        kit.materialize(kube, namespace, body)
        worker = pool.start("metered", "worker-m", SHARDOPS_IDLE_SECONDS="30", **kit.metrics_env(linger=120))

        # During the first shard: claimed, heartbeating, nothing completed yet.
        def first_heartbeat() -> kit.Samples | None:
            samples = kit.scrape(worker)
            beats = kit.sample(samples, "shardops_worker_heartbeats_total", campaign=campaign, outcome="ok")
            return samples if beats >= 1 else None

        during = kit.poll("a heartbeat on the worker's /metrics", first_heartbeat, timeout=60)
        assert worker.popen.poll() is None and not worker.events("metrics-lingering")
        assert kit.sample(during, "shardops_worker_claims_total", campaign=campaign, outcome="won") >= 1
        assert kit.sample(during, "shardops_worker_claims_total", campaign=campaign, outcome="lost") == 0

        # The campaign is finished: the worker's loop ended and it waits for one more scrape.
        kit.poll("the worker to linger for a last scrape", lambda: worker.events("metrics-lingering"), 90)
        final = kit.scrape(worker)
        assert kit.wait_exit([worker], timeout=60) == [0], "the last scrape ends the linger"

    def value(name: str, **labels: str) -> float:
        return kit.sample(final, name, campaign=campaign, **labels)

    (ended,) = worker.events("metrics-final")
    assert ended["scraped"] is True
    # The figures agree with the API server's record.
    shards = kit.shards_of(kube, namespace, "metered")
    assert [s.phase for s in shards] == ["Done", "Done"]
    claims = [h for s in shards for h in s.current_status.history if h.reason == "Claimed"]
    assert [h.owner for h in claims] == [worker.holder] * 2
    assert value("shardops_worker_claims_total", outcome="won") == len(claims) == 2
    assert value("shardops_worker_claims_total", outcome="lost") == 0
    assert value("shardops_worker_shards_total", shard_class="work", outcome="done", error_class="") == 2
    assert value("shardops_worker_heartbeats_total", outcome="ok") >= 2
    assert value("shardops_worker_heartbeats_total", outcome="failed") == 0
    succeeded = {"shard_class": "work", "outcome": "succeeded"}
    assert value("shardops_worker_command_duration_seconds_count", **succeeded) == 2
    seconds = value("shardops_worker_command_duration_seconds_sum", **succeeded)
    assert seconds >= 2 * LATENCY, seconds
    assert not [k for k in final if k[0] == "shardops_worker_fenced_total"], "nothing was fenced"
    print(
        f"\nworker metrics: 2 claims won, {value('shardops_worker_heartbeats_total', outcome='ok'):.0f} "
        f"heartbeats ok, command time {seconds:.2f}s for 2 shards of {LATENCY}s; final figures read by "
        f"scrape {ended['scrapes']} before exit"
    )
