"""Fencing (docs/architecture.md, "Fencing"): a worker frozen past its lease comes back to find the
shard taken over; its write is refused and the shard's result is the second worker's.

Worker A claims a shard and is frozen (SIGSTOP) before it stored anything. Its command keeps
running and finishes every item while A sleeps. The lease expires, worker B takes the shard over
(reclaim, attempt 2), runs it and completes it. Then A is thawed (SIGCONT) holding a complete result:
its renewal is refused by the API server (409 on the Lease, in the audit log), it writes nothing,
and the stored result is B's. A's own /metrics counts the fenced run (reason lease) and no shard
it completed.

Run with each result store. With S3 a stale holder could write its own attempt object (one per
fencing token, never overwritten), but the key's committed result is written only after a fenced
Done write succeeded: whatever A left, nothing it wrote becomes the result.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from testbed.cluster.lifecycle import WRITE_VERBS
from testbed.harness import Cluster
from testbed.kits import worker as kit

from shardops.logic.idempotency import item_subkey

ITEMS = 2


@pytest.mark.parametrize("result_store", kit.STORES, indirect=True)
def test_frozen_worker_past_its_lease_is_fenced_and_the_result_is_the_new_holders(
    local_cluster: Cluster,
    namespace: str,
    crds_installed: None,
    tmp_path: Path,
    result_store: kit.StoreUnderTest,
) -> None:
    kube = kit.admin_kube(local_cluster)
    ledger = tmp_path / "ledger.jsonl"
    body = kit.campaign_body(
        "fence",
        [{"id": i} for i in range(ITEMS)],
        shard_size=ITEMS,
        lease_seconds=10,
        heartbeat_seconds=2,
        # Long enough that A is frozen before its command has a single result to flush.
        env={"SHARDOPS_AGENT_LEDGER": str(ledger), "SHARDOPS_AGENT_LATENCY": "4"},
    )
    with kit.worker_pool(local_cluster, namespace, tmp_path) as pool:
        kit.materialize(kube, namespace, body)
        result_store.attach(kube, "fence")
        key = kit.shard_key(body, body["spec"]["items"])
        store_env = result_store.worker_env()
        a = pool.start(
            "fence", "worker-a", SHARDOPS_IDLE_SECONDS="5", **store_env, **kit.metrics_env(linger=60)
        )
        kit.poll("worker A to claim the shard", lambda: a.events("command-started"))
        a.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        subkeys = [item_subkey(item) for item in body["spec"]["items"]]
        flushed, _ = result_store.reader(kube).read_items(key, subkeys)
        assert not flushed, "A flushed results before it was frozen"
        claimed = kit.get_shard(kube, namespace, "fence-00000").current_status
        assert claimed.owner == a.holder and claimed.attempt == 1 and claimed.fencing_token == 1

        # B must outwait the lease A stopped renewing.
        b = pool.start("fence", "worker-b", SHARDOPS_IDLE_SECONDS="30", **store_env)
        done = kit.poll(
            "worker B to take the shard over and complete it",
            lambda: (s := kit.get_shard(kube, namespace, "fence-00000")).phase == "Done" and s,
            timeout=90,
        )
        taken_over_after = time.monotonic() - frozen_at
        # A's command ran on while A was frozen: both its items are done (attempt 1).
        a_runs = [e for e in kit.ledger(ledger) if e["event"] == "done" and e["attempt"] == 1]
        assert len(a_runs) == ITEMS

        a.signal(signal.SIGCONT)
        fenced = kit.poll("worker A to notice it was fenced", lambda: a.events("fenced"), timeout=30)
        kit.poll("worker A to linger for a last scrape", lambda: a.events("metrics-lingering"), 30)
        a_metrics = kit.scrape(a)
        assert kit.wait_exit([a, b], timeout=60) == [0, 0]

    # A held a complete result and threw it away.
    assert fenced[0]["shard"] == "fence-00000" and fenced[0]["token"] == 1
    assert fenced[0]["discarded"] == ITEMS, fenced
    assert not a.events("completed") and not a.events("failed")
    # ...and counted it: one fenced run (its Lease renewal before the Done write was refused), and a
    # command that succeeded (every item done while A was frozen): work thrown away, as it must be.
    campaign = f"{namespace}/fence"

    def a_value(name: str, **labels: str) -> float:
        return kit.sample(a_metrics, name, campaign=campaign, **labels)

    assert a_value("shardops_worker_fenced_total", reason="lease") == 1
    assert a_value("shardops_worker_shards_total", shard_class="work", outcome="fenced", error_class="") == 1
    assert a_value("shardops_worker_shards_total", shard_class="work", outcome="done", error_class="") == 0
    succeeded = {"shard_class": "work", "outcome": "succeeded"}
    assert a_value("shardops_worker_command_duration_seconds_count", **succeeded) == 1
    assert a_value("shardops_worker_claims_total", outcome="won") == 1

    # The shard's story: A claimed, its lease expired, B reclaimed and claimed (attempt 2), B completed.
    status = kit.get_shard(kube, namespace, "fence-00000").current_status
    assert status == done.current_status, "something wrote the shard after B completed it"
    story = [(h.reason, h.attempt, h.owner) for h in status.history]
    assert story == [
        ("Materialized", 1, None),
        ("Claimed", 1, a.holder),
        ("LeaseExpired", 1, a.holder),
        ("Claimed", 2, b.holder),
        ("Completed", 2, b.holder),
    ], story

    # The stored result is B's: written by B, every item from attempt 2; the key's committed result
    # (what a re-applied campaign reuses) is the one the shard's status names.
    committed = result_store.committed(kube, key)
    assert committed is not None and status.result is not None
    assert committed.name == status.result.ref and committed.fingerprint == status.result.fingerprint
    assert result_store.owner(committed) == b.holder
    document = json.loads(committed.text)
    assert [entry["result"]["attempt"] for entry in document["items"]] == [2] * ITEMS
    assert result_store.committed_count(kube) == 1

    # The API server's record: after B's claim, every write A tried was refused.
    # Writes only: the audit log records reads too, and A may read after B's claim (that is allowed).
    audit = [e for e in kit.audit_entries(local_cluster, namespace) if e.get("verb") in WRITE_VERBS]
    a_writes = [e for e in audit if a.holder in (e.get("userAgent") or "")]
    b_claim = min(
        e["stageTimestamp"]
        for e in audit
        if b.holder in (e.get("userAgent") or "") and (e.get("objectRef") or {}).get("resource") == "shards"
    )
    late = [e for e in a_writes if e["stageTimestamp"] > b_claim]
    codes = [(e["verb"], e["objectRef"]["resource"], e["responseStatus"]["code"]) for e in late]
    assert late, "A made no write attempt after B's claim: the fence was not exercised"
    assert all(code >= 400 for _, _, code in codes), codes
    assert ("patch", "leases", 409) in codes, codes
    print(
        f"\nfencing: A frozen {taken_over_after:.1f}s until B completed (lease 10s); A thawed with "
        f"{fenced[0]['discarded']} unflushed results and was fenced: its writes after B's claim {codes}; "
        f"result written by {b.holder}, attempt 2"
    )
