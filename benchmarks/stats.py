"""Pure arithmetic of the benchmarks: medians and spreads, percentiles, deciles, time-weighted means.

No I/O and no clock: every function takes the numbers it works on, so tests/benchmarks/test_stats.py can
check each one exactly.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """The median of some repeats, with the smallest and the largest of them."""

    median: float
    low: float
    high: float
    count: int

    def show(self, digits: int = 2, unit: str = "") -> str:
        text = f"{self.median:.{digits}f}{unit}"
        if self.count > 1:
            text += f" ({self.low:.{digits}f}..{self.high:.{digits}f}, n={self.count})"
        return text


def spread(values: Sequence[float]) -> Spread | None:
    """Median and range of `values`; None when there are none."""
    if not values:
        return None
    return Spread(statistics.median(values), min(values), max(values), len(values))


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The `fraction` (0..1) percentile by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = fraction * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    weight = position - below
    return ordered[below] * (1 - weight) + ordered[above] * weight


def decile_spans(
    start: float, completions: Sequence[float], parts: int = 10
) -> list[tuple[float, float, int]]:
    """Each tenth of the completions, in completion order: (begin, end, how many completed).

    Part k holds completions k*n/parts .. (k+1)*n/parts (n = how many completed); it spans from the
    previous part's last completion (or `start`) to its own last. Fewer completions than parts: one
    part per completion.
    """
    ordered = sorted(completions)
    if not ordered:
        return []
    parts = min(parts, len(ordered))
    spans = []
    previous_end = start
    for part in range(parts):
        first = part * len(ordered) // parts
        last = (part + 1) * len(ordered) // parts
        end = ordered[last - 1]
        spans.append((previous_end, end, last - first))
        previous_end = end
    return spans


def decile_rates(start: float, completions: Sequence[float], parts: int = 10) -> list[float]:
    """Throughput (completions per second) of each tenth of the completions (`decile_spans`)."""
    return [count / max(end - begin, 1e-6) for begin, end, count in decile_spans(start, completions, parts)]


def mean_concurrency(intervals: Sequence[tuple[float, float]], window: tuple[float, float]) -> float | None:
    """Time-weighted mean number of `intervals` open during `window` (both [start, end))."""
    begin, end = window
    if end <= begin:
        return None
    covered = sum(max(0.0, min(b, end) - max(a, begin)) for a, b in intervals)
    return covered / (end - begin)


def steady_window(
    completions: Sequence[float], low: float = 0.1, high: float = 0.9
) -> tuple[float, float] | None:
    """The steady state of a run: from its `low` to its `high` completion quantile (ramp-up and tail
    left out). None with fewer than two distinct completion times."""
    ordered = sorted(completions)
    if len(ordered) < 2:
        return None
    begin = ordered[int(low * (len(ordered) - 1))]
    end = ordered[int(high * (len(ordered) - 1))]
    return (begin, end) if end > begin else None


def open_at(intervals: Sequence[tuple[float, float]], moment: float) -> int:
    """How many intervals [start, end) contain `moment`."""
    return sum(1 for a, b in intervals if a <= moment < b)


def slot_turns(
    pending_to_running: Sequence[tuple[float, float]],
    running: Sequence[tuple[float, float]],
    cap: int,
) -> list[tuple[float, float]]:
    """(its turn, its claim) of every shard that got a free slot while it was Pending: its turn is
    the first moment the Running shards and the Pending ones cut before it (ties: listed before it)
    left a slot of `cap` free for it. Waiting behind other Pending shards is waiting for a slot, not
    for a claim: a shard cut while Running < cap behind 80 Pending ones with 5 s of work each waits
    ~20 s for its turn, however fast a free slot claims. A shard claimed before its turn (out of cut
    order: it took an earlier shard's turn, which counts that one's wait) is left out.
    `pending_to_running`: (Pending since, first Running) per shard; `running`: the Running intervals.
    One sweep over the events; each looks at most `cap` Pending shards, and the queue holds the Pending
    ones (the backlog window): O(events x (cap + window))."""
    order = sorted(range(len(pending_to_running)), key=lambda i: (pending_to_running[i][0], i))
    events: list[tuple[float, int, int]] = []  # (at, kind, what): kinds in the order they apply at one moment
    for position, shard in enumerate(order):
        pending, claimed = pending_to_running[shard]
        events.append((pending, 0, position))
        events.append((claimed, 1, position))
    for start, end in running:
        events.append((start, 2, +1))
        events.append((end, 2, -1))
    events.sort()
    queue: list[int] = []  # positions in cut order of the Pending shards, kept sorted
    turn: dict[int, float] = {}
    found: list[tuple[float, float]] = []
    busy = 0
    index = 0
    while index < len(events):
        moment = events[index][0]
        while index < len(events) and events[index][0] == moment:
            _, kind, what = events[index]
            if kind == 0:
                bisect.insort(queue, what)
            elif kind == 1:
                queue.remove(what)
                if what in turn:
                    found.append((turn.pop(what), moment))
            else:
                busy += what
            index += 1
        for position in queue[: max(cap - busy, 0)]:
            turn.setdefault(position, moment)
    return found


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator
