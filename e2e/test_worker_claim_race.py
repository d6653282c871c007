"""Claim race: 8 worker processes compete for 200 one-item shards.

Every shard ends Done exactly once, its item computed exactly once, one result per key, and at no
instant do two workers hold one shard — checked on the recorded history of every Lease and Shard
(a watch from before the first claim) and on the workers' own claim/release journal.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path

from testbed.harness import Cluster
from testbed.kits import worker as kit

from shardops.k8s.api import LEASES, SHARDS

WORKERS = 8
SHARDS_TOTAL = 200


def test_eight_workers_two_hundred_shards_each_done_exactly_once(
    local_cluster: Cluster, namespace: str, crds_installed: None, tmp_path: Path
) -> None:
    kube = kit.admin_kube(local_cluster)
    ledger = tmp_path / "ledger.jsonl"
    body = kit.campaign_body(
        "race",
        [{"id": i} for i in range(SHARDS_TOTAL)],
        shard_size=1,
        max_concurrency=WORKERS + 2,
        env={"SHARDOPS_AGENT_LEDGER": str(ledger), "SHARDOPS_AGENT_LATENCY": "0"},
    )
    with (
        kit.recording(local_cluster, LEASES.path(namespace)) as lease_history,
        kit.recording(local_cluster, SHARDS.path(namespace)) as shard_history,
        kit.worker_pool(local_cluster, namespace, tmp_path) as pool,
    ):
        kit.materialize(kube, namespace, body)
        started = time.monotonic()
        workers = [pool.start("race", f"racer-{i}") for i in range(WORKERS)]
        assert kit.wait_exit(workers, timeout=400) == [0] * WORKERS
        elapsed = time.monotonic() - started
        # The watch may trail the last writes by a moment.
        kit.poll(
            "the shard watch to see every Done",
            lambda: sum(1 for e in shard_history.events if kit.phase_of(e.obj) == "Done") >= SHARDS_TOTAL,
        )
    lease_history.check()
    shard_history.check()

    # Every shard Done exactly once, with one Completed in its history.
    shards = kit.shards_of(kube, namespace, "race")
    assert len(shards) == SHARDS_TOTAL
    assert Counter(s.phase for s in shards) == {"Done": SHARDS_TOTAL}
    for shard in shards:
        reasons = [h.reason for h in shard.current_status.history]
        assert reasons == ["Materialized", "Claimed", "Completed"], (shard.name, reasons)

    # Each item computed exactly once; one result per idempotency key, each shard its own.
    runs = [e for e in kit.ledger(ledger) if e["event"] == "done"]
    per_key = Counter(e["key"] for e in runs)
    assert len(per_key) == SHARDS_TOTAL and max(per_key.values()) == 1, per_key.most_common(3)
    results = kit.result_configmaps(kube, namespace)
    assert len(results) == SHARDS_TOTAL
    refs = Counter(s.current_status.result.ref for s in shards if s.current_status.result)
    assert len(refs) == SHARDS_TOTAL and max(refs.values()) == 1

    # The Leases' recorded history: a holder only ever follows "no holder" (never a takeover, since
    # no lease expired), and every new holder gets a new fencing token.
    leases = lease_history.by_name()
    assert len(leases) == SHARDS_TOTAL
    holder_changes = 0
    for name, events in leases.items():
        previous: str | None = None
        tokens: list[int] = []
        for event in events:
            holder = kit.holder_of(event.obj)
            if holder is not None and holder != previous:
                assert previous is None, f"{name}: {previous} -> {holder} without a release"
                tokens.append(int(event.obj["spec"]["leaseTransitions"]))
                holder_changes += 1
            previous = holder
        assert tokens == sorted(set(tokens)), (name, tokens)

    # The Shards' recorded history: one Running owner at a time, Done reached once and kept.
    for name, events in shard_history.by_name().items():
        phases = [kit.phase_of(e.obj) for e in events]
        first_done = phases.index("Done")
        assert all(p == "Done" for p in phases[first_done:]), (name, phases)
        running = [
            ((e.obj.get("status") or {}).get("owner"), (e.obj.get("status") or {}).get("fencingToken"))
            for e, phase in zip(events, phases, strict=True)
            if phase == "Running"
        ]
        assert len(set(running)) == 1, (name, running)

    # The workers' journal: per shard, claim-to-release intervals of different workers never overlap.
    intervals: dict[str, list[tuple[float, float, str]]] = {}
    for worker in workers:
        claims = {e["shard"]: e["at"] for e in worker.events("claimed")}
        for end in worker.events("completed"):
            intervals.setdefault(end["shard"], []).append((claims[end["shard"]], end["at"], worker.name))
    assert len(intervals) == SHARDS_TOTAL
    for name, spans in intervals.items():
        spans.sort()
        for (_, end, who), (start, _, other) in itertools.pairwise(spans):
            assert start >= end, f"{name}: {who} and {other} held it at once"

    per_worker = Counter({w.name: len(w.events("completed")) for w in workers})
    lost_races = sum(len(w.events("claim-lost")) for w in workers)
    assert min(per_worker.values()) > 0, per_worker
    print(
        f"\nclaim race: {WORKERS} workers, {SHARDS_TOTAL} shards Done in {elapsed:.1f}s "
        f"({SHARDS_TOTAL / elapsed:.1f} shards/s); per worker {sorted(per_worker.values())}; "
        f"{lost_races} lost claim races; {holder_changes} lease acquisitions for {SHARDS_TOTAL} claims "
        f"({holder_changes - SHARDS_TOTAL} Leases taken and given back: the shard was Done by then), "
        f"{len(lease_history.events)} lease and {len(shard_history.events)} shard changes recorded; "
        f"duplicates: 0 results, 0 computations"
    )
