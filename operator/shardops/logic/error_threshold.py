"""The campaign-level error threshold: stop claiming when attempts keep failing for good.

A broken prompt template or a revoked key fails every shard the same way, non-retryably; each
shard fails once, so nothing per shard stops the campaign from trying the next one. This rule looks
at the latest attempt endings of the campaign: `consecutive` non-retryable failures in a row (no
success between), or more than `ratio` of the last `window` endings, hold the campaign.
Retryable failures do not count (they back off and the breakers see them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from shardops.api.enums import ErrorClass


@dataclass(frozen=True)
class AttemptEnd:
    """An attempt that ended Done (`error_class` None) or failed for good (its non-retryable class)."""

    at: datetime
    shard: str
    error_class: ErrorClass | None

    @property
    def failed(self) -> bool:
        return self.error_class is not None


@dataclass(frozen=True)
class Trip:
    rule: str
    error_class: ErrorClass
    shard: str  # the latest failure of that class: the example to look at


def error_threshold_trip(
    ends: Sequence[AttemptEnd], consecutive: int, ratio: float, window: int
) -> Trip | None:
    """Whether `ends` (oldest first) hold the campaign, and by which rule; None when they do not."""
    streak = 0
    for end in reversed(ends):
        if not end.failed:
            break
        streak += 1
    if consecutive and streak >= consecutive:
        failures = list(ends[len(ends) - streak :])
        return _trip(
            f"{streak} non-retryable failures in a row (errorThreshold.consecutive {consecutive})", failures
        )
    recent = list(ends[-window:])
    failures = [end for end in recent if end.failed]
    if len(recent) >= window and len(failures) > ratio * window:
        return _trip(
            f"{len(failures)} of the last {window} attempts failed non-retryably "
            f"(over errorThreshold.ratio {ratio:g})",
            failures,
        )
    return None


def _trip(rule: str, failures: Sequence[AttemptEnd]) -> Trip:
    counts = Counter(end.error_class for end in failures)
    top = max(counts, key=lambda c: (counts[c], max(e.at for e in failures if e.error_class is c)))
    assert top is not None
    example = max((e for e in failures if e.error_class is top), key=lambda e: e.at)
    return Trip(rule, top, example.shard)
