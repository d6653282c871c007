"""Partial resume: a worker killed after 30 of 50 items; the retry runs only the remaining 20.

Items are keyed by sub-key (their fingerprint) and flushed to the items ConfigMap on every
heartbeat. Worker A's command finishes 30 items and stalls; once a heartbeat has stored all 30, A
is SIGKILLed (its command dies with it). After A's lease runs out, worker B reclaims the shard
(attempt 2), finds 30 results stored and hands its command only the other 20. The agent's ledger
counts every call per item.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

from testbed.harness import Cluster
from testbed.kits import worker as kit

TOTAL = 50
FIRST = 30


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_killed_after_30_of_50_items_the_retry_runs_only_the_remaining_20(
    local_cluster: Cluster, namespace: str, crds_installed: None, tmp_path: Path
) -> None:
    kube = kit.admin_kube(local_cluster)
    ledger = tmp_path / "ledger.jsonl"
    body = kit.campaign_body(
        "resume",
        [{"id": i, "question": f"q{i}"} for i in range(TOTAL)],
        shard_size=TOTAL,
        lease_seconds=10,
        heartbeat_seconds=2,
        env={
            "SHARDOPS_AGENT_LEDGER": str(ledger),
            "SHARDOPS_AGENT_LATENCY": "0.02",
            # Attempt 1 stops making progress after 30 items, so the kill lands at exactly 30.
            "SHARDOPS_AGENT_HANG_AFTER": str(FIRST),
            "SHARDOPS_AGENT_FAULT_ATTEMPTS": "1",
        },
    )
    with kit.worker_pool(local_cluster, namespace, tmp_path) as pool:
        kit.materialize(kube, namespace, body)
        key = kit.shard_key(body, body["spec"]["items"])
        a = pool.start("resume", "worker-a")
        kit.poll(
            "a heartbeat to store 30 item results",
            lambda: (
                (p := kit.get_shard(kube, namespace, "resume-00000").current_status.progress)
                and p.done == FIRST
            ),
        )
        assert len(kit.stored_items(kube, namespace, key)) == FIRST
        command_pid = a.events("command-started")[0]["pid"]
        a.signal(signal.SIGKILL)
        assert a.wait(10) == -signal.SIGKILL
        kit.poll("A's command to die with A", lambda: _gone(command_pid), timeout=10)

        b = pool.start("resume", "worker-b", SHARDOPS_IDLE_SECONDS="30")
        done = kit.poll(
            "worker B to reclaim and finish the shard",
            lambda: (s := kit.get_shard(kube, namespace, "resume-00000")).phase == "Done" and s,
            timeout=90,
        )
        assert kit.wait_exit([b], timeout=60) == [0]

    calls = kit.ledger(ledger)
    first = [e for e in calls if e["attempt"] == 1]
    second = [e for e in calls if e["attempt"] == 2]
    # Attempt 1 computed items 0-29 (and started nothing else); attempt 2 only items 30-49.
    assert sorted(e["index"] for e in first if e["event"] == "done") == list(range(FIRST))
    assert sorted(e["index"] for e in second if e["event"] == "start") == list(range(FIRST, TOTAL))
    assert sorted(e["index"] for e in second if e["event"] == "done") == list(range(FIRST, TOTAL))
    per_item = Counter(e["key"] for e in calls if e["event"] == "start")
    assert len(per_item) == TOTAL and set(per_item.values()) == {1}, per_item.most_common(3)

    claimed = b.events("claimed")[0]
    assert claimed["resumed"] == FIRST and claimed["attempt"] == 2 and claimed["reclaimed_from"] == a.holder
    assert b.events("command-started")[0]["items"] == TOTAL - FIRST

    status = done.current_status
    assert [(h.reason, h.attempt) for h in status.history] == [
        ("Materialized", 1),
        ("Claimed", 1),
        ("LeaseExpired", 1),
        ("Claimed", 2),
        ("Completed", 2),
    ]
    assert status.progress is not None and (status.progress.done, status.progress.total) == (TOTAL, TOTAL)
    stored = kit.stored_result(kube, namespace, key)
    assert stored is not None and done.current_status.result is not None
    assert stored.name == done.current_status.result.ref
    document = json.loads(stored.text)
    assert [entry["index"] for entry in document["items"]] == list(range(TOTAL))
    assert len({entry["key"] for entry in document["items"]}) == TOTAL
    by_attempt = Counter(entry["result"]["attempt"] for entry in document["items"])
    assert by_attempt == {1: FIRST, 2: TOTAL - FIRST}
    first_done = len([e for e in first if e["event"] == "done"])
    second_done = len([e for e in second if e["event"] == "done"])
    print(
        f"\npartial resume: attempt 1 computed {first_done} items and was killed; attempt 2 was handed "
        f"{b.events('command-started')[0]['items']} items and computed {second_done}; "
        f"calls per item: max {max(per_item.values())}; "
        f"result: {len(document['items'])} items ({dict(by_attempt)} by attempt), cost {status.cost}"
    )
