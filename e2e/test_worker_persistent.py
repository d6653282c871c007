"""spec.worker.persistent through the operator, its worker Jobs and real pods: each worker's command
process serves shard after shard, a command that crashes mid-shard costs that shard one attempt and
the next shard a new process, and every result is exact."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from testbed.bed import Bed

from e2e.test_bad_input import _assert_exact, _results
from shardops.k8s.api import JOBS, SHARDS

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

SHARDS_IN_ALL = 24
WORKERS = 2


def test_one_process_per_worker_serves_its_shards_and_a_crash_costs_one_attempt(
    bed: Bed, tmp_path: Path
) -> None:
    kube = bed.kube
    ledger = tmp_path / "ledger.jsonl"
    items: list[dict[str, object]] = [{"n": i} for i in range(SHARDS_IN_ALL)]
    # The agent SIGKILLs itself on this item's first attempt: the process dies mid-shard.
    items[7] = {"n": 7, "fault": "crash", "faultAttempts": [1]}
    body = bed.campaign_body(
        "served",
        items,
        shardSize=1,
        maxConcurrency=WORKERS,
        worker_env={"SHARDOPS_AGENT_LATENCY": 0.05, "SHARDOPS_AGENT_LEDGER": ledger},
    )
    body["spec"]["worker"]["persistent"] = True
    with bed.operator():
        bed.create_campaign(body)
        final = bed.wait_phase("served", {"Succeeded", "Failed", "Completed"}, timeout=240)
        assert final["status"]["phase"] == "Succeeded", final["status"]
        _assert_exact(_results(bed.cluster, bed.namespace, "served"), items)
        jobs = kube.list(JOBS, bed.namespace, label_selector="shardops.dev/campaign=served")

    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    shards_by_pid: dict[int, set[str]] = defaultdict(set)
    for entry in entries:
        shards_by_pid[entry["pid"]].add(entry["shard"])
    processes = len(shards_by_pid)
    # One process per worker pod, plus the one that replaced the crashed process.
    assert processes <= len(jobs) + 1, (processes, len(jobs))
    assert processes < SHARDS_IN_ALL / 4, f"{processes} processes for {SHARDS_IN_ALL} shards"
    assert max(len(s) for s in shards_by_pid.values()) >= 5, "a process served shard after shard"

    crashed = kube.get(SHARDS, bed.namespace, "served-00007")
    claims = [e["attempt"] for e in bed.history(crashed) if e["reason"] == "Claimed"]
    assert crashed["status"]["phase"] == "Done" and claims == [1, 2], claims
    crash_pids = {e["pid"] for e in entries if e["shard"] == "served-00007"}
    assert len(crash_pids) == 2, "the retry ran in a new process"
    print(f"\n{SHARDS_IN_ALL} shards, {len(jobs)} worker Job(s): {processes} command processes")
