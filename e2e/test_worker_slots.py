"""spec.worker.slots through the operator, its worker Jobs and real pods: a pod runs several shards
at once, the operator starts Jobs by slots (the last one with the rest), the campaign's running
shards never pass maxConcurrency, and every result is exact."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from testbed.bed import Bed

from e2e.test_bad_input import _assert_exact, _results
from shardops.api.names import WORKER_SLOTS_ANNOTATION
from shardops.k8s.api import JOBS

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

SHARDS_IN_ALL = 24
MAX_CONCURRENCY = 6
SLOTS = 4


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most of the [start, end] spans open at one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    open_now = most = 0
    for _, step in edges:
        open_now += step
        most = max(most, open_now)
    return most


def test_a_pod_of_several_slots_runs_its_shards_at_once_within_max_concurrency(
    bed: Bed, tmp_path: Path
) -> None:
    kube = bed.kube
    ledger = tmp_path / "ledger.jsonl"
    items: list[dict[str, object]] = [{"n": i} for i in range(SHARDS_IN_ALL)]
    body = bed.campaign_body(
        "slotted",
        items,
        shardSize=1,
        maxConcurrency=MAX_CONCURRENCY,
        worker_env={"SHARDOPS_AGENT_LATENCY": 0.5, "SHARDOPS_AGENT_LEDGER": ledger},
    )
    body["spec"]["worker"]["slots"] = SLOTS
    with bed.operator():
        bed.create_campaign(body)
        final = bed.wait_phase("slotted", {"Succeeded", "Failed", "Completed"}, timeout=240)
        assert final["status"]["phase"] == "Succeeded", final["status"]
        _assert_exact(_results(bed.cluster, bed.namespace, "slotted"), items)
        jobs = kube.list(JOBS, bed.namespace, label_selector="shardops.dev/campaign=slotted")

    # Jobs by slots: none has more than spec.worker.slots, and the first start fills the cap with
    # as few pods as slots allow (4 + 2), never 6 pods of one.
    slots = {
        job["metadata"]["name"]: int(job["metadata"]["annotations"][WORKER_SLOTS_ANNOTATION]) for job in jobs
    }
    assert slots and all(1 <= n <= SLOTS for n in slots.values()), slots
    assert len(jobs) < SHARDS_IN_ALL / 2, f"{len(jobs)} worker Jobs for {SHARDS_IN_ALL} shards: {slots}"

    # Each item's run, from the agent's ledger: when it started and finished, in which pod.
    started: dict[str, tuple[float, str]] = {}
    spans_by_pod: dict[str, list[tuple[float, float]]] = defaultdict(list)
    spans: list[tuple[float, float]] = []
    for entry in map(json.loads, ledger.read_text().splitlines()):
        run = f"{entry['shard']}/{entry['attempt']}"
        if entry["event"] == "start":
            started[run] = (entry["at"], entry["pod"])
        elif entry["event"] == "done" and run in started:
            at, pod = started[run]
            spans.append((at, entry["at"]))
            spans_by_pod[pod].append((at, entry["at"]))
    assert len(spans) >= SHARDS_IN_ALL
    per_pod = {pod: _most_at_once(pod_spans) for pod, pod_spans in spans_by_pod.items()}
    # A pod ran several of its shards at once, and never more than its slots.
    assert max(per_pod.values()) >= 2, per_pod
    assert all(n <= SLOTS for n in per_pod.values()), per_pod
    assert _most_at_once(spans) <= MAX_CONCURRENCY
    print(
        f"\n{SHARDS_IN_ALL} shards, {len(jobs)} worker Job(s) of slots {sorted(slots.values())}: "
        f"most at once per pod {per_pod}, in all {_most_at_once(spans)}"
    )
