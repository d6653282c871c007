"""The benchmarks' arithmetic (benchmarks/stats.py), profile parsing and item encoding, exactly."""

from __future__ import annotations

import json

import pytest
from benchmarks import profiling, stats
from benchmarks.scenarios import compact_items


def test_spread_is_median_and_range() -> None:
    found = stats.spread([3.0, 1.0, 2.0])
    assert found == stats.Spread(2.0, 1.0, 3.0, 3)
    assert found.show(1, " s") == "2.0 s (1.0..3.0, n=3)"
    assert stats.spread([]) is None
    assert stats.Spread(1.0, 1.0, 1.0, 1).show(0) == "1"


def test_percentile_interpolates_between_ranks() -> None:
    assert stats.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert stats.percentile([0.0, 10.0], 0.99) == pytest.approx(9.9)
    assert stats.percentile([7.0], 0.99) == 7.0
    assert stats.percentile([], 0.5) is None


def test_decile_rates_split_completions_into_equal_parts() -> None:
    # 20 completions, one per second after a start at 0: every tenth (2 shards) takes 2 s.
    assert stats.decile_rates(0.0, [float(t) for t in range(1, 21)]) == [1.0] * 10
    # Slowing down: the second half takes twice as long per shard.
    times = [float(t) for t in range(1, 11)] + [10.0 + 2 * t for t in range(1, 11)]
    rates = stats.decile_rates(0.0, times)
    assert rates[0] == 1.0 and rates[-1] == 0.5
    assert stats.decile_rates(0.0, [2.0, 4.0]) == [0.5, 0.5]
    assert stats.decile_rates(0.0, []) == []


def test_mean_concurrency_and_steady_window() -> None:
    intervals = [(0.0, 10.0), (5.0, 10.0)]
    assert stats.mean_concurrency(intervals, (0.0, 10.0)) == 1.5
    assert stats.mean_concurrency(intervals, (5.0, 10.0)) == 2.0
    assert stats.mean_concurrency(intervals, (3.0, 3.0)) is None
    assert stats.steady_window([float(t) for t in range(11)]) == (1.0, 9.0)
    assert stats.steady_window([1.0]) is None
    assert stats.open_at(intervals, 5.0) == 2 and stats.open_at(intervals, 10.0) == 0


def test_compact_items_fit_a_configmap_and_keep_shards_distinct() -> None:
    items = compact_items(100_000, 10)
    text = "\n".join(json.dumps(i, separators=(",", ":")) for i in items)
    assert len(text.encode()) < 1024 * 1024
    shards = [tuple(json.dumps(i) for i in items[k : k + 10]) for k in range(0, len(items), 10)]
    assert len(set(shards)) == len(shards)
    assert all(len(set(shard)) == len(shard) for shard in shards)
    assert compact_items(3, 1) == [{"": 0}, {"": 1}, {"": 2}]


def test_profile_parse_counts_inclusive_and_self() -> None:
    raw = (
        "Thread 1 (active);main (a/x.py:1);list (shardops/k8s/api.py:10);read (lib/python3.11/ssl.py:5) 3\n"
        "Thread 1 (active);main (a/x.py:1);parse (operator/shardops/api/shard.py:2) 1\n"
        "garbage line\n"
    )
    profile = profiling.parse("p", raw)
    assert profile.samples == 4
    assert profile.inclusive["main (a/x.py)"] == 4
    assert profile.leaf["read (ssl.py)"] == 3
    assert profile.leaf["parse (shardops/api/shard.py)"] == 1
    assert profile.top(profile.leaf, 1) == [("read (ssl.py)", 75.0)]
