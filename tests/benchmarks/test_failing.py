"""The failing-at-scale scenario's pure parts (benchmarks/scenarios/failing.py): which shards fail and
how, the bound it holds every kind to, the samples it tabulates, and the sizes it reads."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.plan import FULL, QUICK, SMOKE, narrowed
from benchmarks.runs import Sample, object_bytes, peak_counts
from benchmarks.scenarios.failing import (
    events_by_reason,
    failing_items,
    failing_shards,
    over_time,
    window_bound,
)
from benchmarks.scenarios.scale import jsonl

from shardops.api.enums import ErrorClass
from shardops.k8s.api import EVENTS
from shardops_example_agent import agent
from tests.fakekube import FakeKube


def test_one_shard_in_ten_fails_the_last_of_each_ten() -> None:
    assert list(failing_shards(25, 10)) == [9, 19]
    assert len(failing_shards(5000, 10)) == 500
    items = failing_items(100, 10, 10)
    faulty = [n for n, item in enumerate(items) if "fault" in item]
    assert faulty == [90], "only the first item of shard 9 (items 90..99) carries the fault"
    # Apart from the fault, the items are the scale runs' compact ones: shards stay distinct.
    assert {k: v for k, v in items[90].items() if k != "fault"} == {"": 90}
    assert items[91] == {"": 1}


def test_a_failing_shard_fails_non_retryably_in_the_example_agent(tmp_path: Path) -> None:
    """The fault is one the agent turns into a non-retryable class at the shard's first item."""
    items = failing_items(20, 10, 2)
    entries = [{"key": f"k{n}", "index": n, "item": item} for n, item in enumerate(items[10:20])]
    (tmp_path / "items.jsonl").write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    env = {
        "SHARDOPS_ITEMS_FILE": str(tmp_path / "items.jsonl"),
        "SHARDOPS_RESULTS_FILE": str(tmp_path / "results.jsonl"),
        "SHARDOPS_ERROR_FILE": str(tmp_path / "error.json"),
        "SHARDOPS_AGENT_LATENCY": "0",
    }
    assert agent.run_shard(env) != 0
    error = json.loads((tmp_path / "error.json").read_text())
    assert not ErrorClass(error["class"]).retryable, error
    assert not (tmp_path / "results.jsonl").exists(), "it failed at its first item"

    (tmp_path / "error.json").unlink()
    succeeding = [{"key": f"k{n}", "index": n, "item": item} for n, item in enumerate(items[:10])]
    (tmp_path / "items.jsonl").write_text("\n".join(json.dumps(e) for e in succeeding) + "\n")
    assert agent.run_shard(env) == 0
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 10


def test_the_full_sets_items_fit_one_object_line_by_line() -> None:
    case = FULL.failing[0]
    assert (case.items, case.shard_size, case.fail_every) == (500_000, 100, 10)
    text = jsonl(failing_items(case.items, case.shard_size, case.fail_every))
    assert text.count("\n") == case.items - 1
    assert text.count('"fault":"invalid"') == 500


def test_the_bound_is_the_window_and_the_gave_up_tail() -> None:
    # backlogRatio 5 x 20 pending + 20 running + the 50 newest gave-up shards kept alive.
    assert window_bound(20) == 170
    assert window_bound(2) == 62


def _sample(at: float, **counts: int) -> Sample:
    return Sample(at, counts, None, None)


def test_over_time_spreads_its_rows_and_keeps_the_first_and_last() -> None:
    few = [_sample(n) for n in range(3)]
    assert over_time(few) == few
    many = [_sample(n) for n in range(101)]
    picked = [s.at for s in over_time(many, 11)]
    assert picked == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert [s.at for s in over_time([_sample(n) for n in range(5)], 3)] == [0, 2, 4]


def test_peak_counts_take_each_kinds_largest_and_zero_for_one_never_counted() -> None:
    samples = [_sample(0, Shards=3, Events=1), _sample(1, Shards=7), _sample(2, Shards=5, Events=4)]
    peaks = peak_counts(samples)
    assert peaks["Shards"] == 7 and peaks["Events"] == 4 and peaks["Leases"] == 0


def test_object_bytes_are_compact_json_in_utf8() -> None:
    assert object_bytes({"a": [1, 2]}) == len('{"a":[1,2]}')
    assert object_bytes({"n": "é"}) == len('{"n":"é"}'.encode())


def test_every_set_has_a_failing_case_and_narrowing_names_it() -> None:
    assert all(plan.failing for plan in (FULL, QUICK, SMOKE))
    keys = [c.key for p in (FULL, QUICK, SMOKE) for c in (*p.versus, *p.scale, *p.failing)]
    assert all(
        len({c.key for c in (*p.versus, *p.scale, *p.failing)})
        == len(p.versus) + len(p.scale) + len(p.failing)
        for p in (FULL, QUICK, SMOKE)
    ), keys
    one = narrowed(FULL, frozenset({"500k-failing"}), None)
    assert [c.key for c in one.failing] == ["500k-failing"] and one.scale == FULL.scale
    assert narrowed(FULL, frozenset({"100k"}), None).failing == FULL.failing


def test_events_are_counted_by_kind_and_reason_with_the_occurrences_their_series_count() -> None:
    kube = FakeKube()

    def add(name: str, kind: str, reason: str, **extra: object) -> None:
        kube.add(
            EVENTS,
            {
                "metadata": {"name": name, "namespace": "b"},
                "regarding": {"kind": kind},
                "reason": reason,
                **extra,
            },
        )

    add("camp.failed", "Campaign", "Failed", series={"count": 20})
    add("p1", "Pod", "RunAsProcess")
    add("p2", "Pod", "RunAsProcess")
    assert events_by_reason(kube, "b") == {"Pod/RunAsProcess": [2, 2], "Campaign/Failed": [1, 20]}
