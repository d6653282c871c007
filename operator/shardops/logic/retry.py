"""Pure: which shards a retry request (`spec.retry`) sends back to Pending."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardops.api.enums import ShardPhase

GAVE_UP = frozenset({ShardPhase.BLOCKED, ShardPhase.FAILED})


@dataclass(frozen=True)
class RetryChoice:
    """`retry`: the Blocked/Failed shards to send back to Pending, sorted. `skipped`: listed shards
    that are not Blocked or Failed (or do not exist), with their phase ("not found" for no shard)."""

    retry: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()


def choose_retry(phases: Mapping[str, ShardPhase], listed: Sequence[str] | None) -> RetryChoice:
    """Every Blocked and Failed shard when `listed` is unset or empty; else the listed ones that are."""
    if not listed:
        return RetryChoice(tuple(sorted(name for name, phase in phases.items() if phase in GAVE_UP)))
    retry: list[str] = []
    skipped: list[tuple[str, str]] = []
    for name in sorted(set(listed)):
        phase = phases.get(name)
        if phase in GAVE_UP:
            retry.append(name)
        else:
            skipped.append((name, "not found" if phase is None else str(phase)))
    return RetryChoice(tuple(retry), tuple(skipped))


def skipped_text(skipped: Sequence[tuple[str, str]], limit: int = 10) -> str:
    """`; skipped (not Blocked or Failed): a (Done), b (not found)`, or "" for none."""
    if not skipped:
        return ""
    shown = ", ".join(f"{name} ({phase})" for name, phase in skipped[:limit])
    more = f", +{len(skipped) - limit} more" if len(skipped) > limit else ""
    return f"; skipped (not Blocked or Failed): {shown}{more}"
