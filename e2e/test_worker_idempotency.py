"""Idempotency: results live under the shard's idempotency key and outlive the Campaign.

Deleting and re-applying the same Campaign finds every result already stored and recomputes none;
changing one item changes one shard's key, and only that shard runs again. Run with each result
store.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from testbed.harness import Cluster
from testbed.kits import worker as kit

from shardops_example_agent.agent import answer


def _run_to_completion(
    pool: kit.WorkerPool, campaign: str, workers: int, tag: str, store: kit.StoreUnderTest
) -> list[kit.WorkerProcess]:
    env = store.worker_env()
    started = [pool.start(campaign, f"{tag}-{i}", SHARDOPS_IDLE_SECONDS="3", **env) for i in range(workers)]
    assert kit.wait_exit(started, timeout=120) == [0] * workers
    return started


@pytest.mark.parametrize("result_store", kit.STORES, indirect=True)
def test_reapplied_campaign_reuses_results_and_a_changed_item_recomputes_only_its_shard(
    local_cluster: Cluster,
    namespace: str,
    crds_installed: None,
    tmp_path: Path,
    result_store: kit.StoreUnderTest,
) -> None:
    kube = kit.admin_kube(local_cluster)
    ledger = tmp_path / "ledger.jsonl"
    items = [{"id": i, "text": f"item {i}"} for i in range(12)]
    body = kit.campaign_body(
        "idem",
        items,
        shard_size=3,
        env={"SHARDOPS_AGENT_LEDGER": str(ledger), "SHARDOPS_AGENT_LATENCY": "0.02"},
    )
    with kit.worker_pool(local_cluster, namespace, tmp_path) as pool:
        # 1. First run: every item computed once.
        kit.materialize(kube, namespace, body)
        result_store.attach(kube, "idem")
        _run_to_completion(pool, "idem", 2, "first", result_store)
        first = kit.shards_of(kube, namespace, "idem")
        assert [s.phase for s in first] == ["Done"] * 4
        computed_first = Counter(e["key"] for e in kit.ledger(ledger) if e["event"] == "done")
        assert len(computed_first) == 12 and set(computed_first.values()) == {1}
        results_first = {s.spec.idempotency_key: s.current_status.result for s in first}
        assert all(r is not None for r in results_first.values())

        # 2. Delete the Campaign (shards and Leases go with it), re-apply the same one.
        kit.delete_campaign(kube, namespace, "idem")
        assert result_store.committed_count(kube) == 4, "results must outlive the Campaign"
        kit.materialize(kube, namespace, body)
        result_store.attach(kube, "idem")
        second_workers = _run_to_completion(pool, "idem", 2, "again", result_store)
        second = kit.shards_of(kube, namespace, "idem")
        assert [s.phase for s in second] == ["Done"] * 4
        after_reapply = kit.ledger(ledger)
        assert len([e for e in after_reapply if e["event"] == "start"]) == 12, (
            "a stored result was recomputed"
        )
        for shard in second:
            assert shard.current_status.result == results_first[shard.spec.idempotency_key]
        reused = [e for w in second_workers for e in w.events("completed") if e["reused"]]
        assert len(reused) == 4

        # 3. Change one item: only its shard gets a new key and runs again.
        kit.delete_campaign(kube, namespace, "idem")
        changed_items = [dict(item) for item in items]
        changed_items[7]["text"] = "item 7, edited"
        changed = kit.campaign_body(
            "idem",
            changed_items,
            shard_size=3,
            env={"SHARDOPS_AGENT_LEDGER": str(ledger), "SHARDOPS_AGENT_LATENCY": "0.02"},
        )
        kit.materialize(kube, namespace, changed)
        result_store.attach(kube, "idem")
        third_workers = _run_to_completion(pool, "idem", 2, "changed", result_store)
        third = kit.shards_of(kube, namespace, "idem")
        assert [s.phase for s in third] == ["Done"] * 4
        new_runs = kit.ledger(ledger)[len(after_reapply) :]
        rerun_shards = {e["shard"] for e in new_runs}
        assert rerun_shards == {"idem-00002"}, rerun_shards
        assert sorted(e["index"] for e in new_runs if e["event"] == "done") == [0, 1, 2]
        for shard in third:
            same = shard.spec.idempotency_key in results_first
            assert same == (shard.name != "idem-00002")
        third_reused = [e for w in third_workers for e in w.events("completed") if e["reused"]]
        assert len(third_reused) == 3

        # Every stored result verifies (read_result checks it), and the changed shard's result holds
        # the edited item's answer.
        assert result_store.committed_count(kube) == 5
        keys = {s.spec.idempotency_key for s in first} | {s.spec.idempotency_key for s in third}
        assert all(result_store.committed(kube, key) is not None for key in keys)
        edited = next(s for s in third if s.name == "idem-00002")
        committed = result_store.committed(kube, edited.spec.idempotency_key)
        assert committed is not None and edited.current_status.result is not None
        assert committed.name == edited.current_status.result.ref
        document = json.loads(committed.text)
        assert [entry["index"] for entry in document["items"]] == [0, 1, 2]
        assert document["items"][1]["result"]["answer"] == answer(changed_items[7]), document
    print(
        f"\nidempotency ({result_store.kind}): first run computed {sum(computed_first.values())} items; "
        "re-apply reused "
        f"{len(reused)}/4 shard results, computed 0; one edited item recomputed {len(rerun_shards)} shard "
        f"({len([e for e in new_runs if e['event'] == 'done'])} items), reused {len(third_reused)}"
    )
