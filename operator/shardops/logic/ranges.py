"""Sets of shard indices as sorted, disjoint, half-open ranges: the compact record of which shards
were folded. Shards are cut and finish roughly in index order, so a campaign's folded set is a few
ranges (one per gap left by a shard still live), however many shards it has."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence

Range = tuple[int, int]


def normalize(ranges: Iterable[Range]) -> list[Range]:
    """Sorted, merged (touching ranges join), empty ones dropped."""
    merged: list[Range] = []
    for start, end in sorted(r for r in ranges if r[0] < r[1]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def add(ranges: Sequence[Range], indices: Iterable[int]) -> list[Range]:
    """`ranges` with `indices` added."""
    return normalize([*ranges, *((i, i + 1) for i in indices)])


def remove(ranges: Sequence[Range], indices: Iterable[int]) -> list[Range]:
    """`ranges` without `indices` (each splits the range holding it)."""
    result = list(normalize(ranges))
    for index in indices:
        position = bisect_right(result, (index, float("inf"))) - 1
        if position < 0 or not result[position][0] <= index < result[position][1]:
            continue
        start, end = result[position]
        result[position : position + 1] = [r for r in ((start, index), (index + 1, end)) if r[0] < r[1]]
    return result


def contains(ranges: Sequence[Range], index: int) -> bool:
    """Whether `index` is in the normalized `ranges` (binary search)."""
    position = bisect_right(ranges, (index, float("inf"))) - 1
    return position >= 0 and ranges[position][0] <= index < ranges[position][1]


def size(ranges: Sequence[Range]) -> int:
    return sum(end - start for start, end in ranges)
