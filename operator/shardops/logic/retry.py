"""Pure: which shards a retry request (`spec.retry`) sends back to Pending."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from shardops.api.enums import ShardPhase

GAVE_UP = frozenset({ShardPhase.BLOCKED, ShardPhase.FAILED})


@dataclass(frozen=True)
class RetryChoice:
    """`retry`: the Blocked/Failed shards to send back to Pending, sorted. `skipped`: listed shards
    that are not Blocked or Failed (or do not exist), with their phase ("not found" for no shard).
    `applied`: shards this request already retried (in an earlier run of it), left as they are."""

    retry: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    applied: tuple[str, ...] = ()


def choose_retry(
    phases: Mapping[str, ShardPhase], listed: Sequence[str] | None, applied: Set[str] = frozenset()
) -> RetryChoice:
    """Every Blocked and Failed shard when `listed` is unset or empty; else the listed ones that are.
    A shard in `applied` was retried by this very request already: whatever its phase now, it is
    not retried again (a request is applied once, however many times the pass acting on it runs)."""
    wanted = sorted(set(listed)) if listed else sorted(phases)
    retry: list[str] = []
    skipped: list[tuple[str, str]] = []
    done: list[str] = []
    for name in wanted:
        phase = phases.get(name)
        if name in applied and phase is not None:
            done.append(name)
        elif phase in GAVE_UP:
            retry.append(name)
        elif listed:
            skipped.append((name, "not found" if phase is None else str(phase)))
    return RetryChoice(tuple(retry), tuple(skipped), tuple(done))


def skipped_text(skipped: Sequence[tuple[str, str]], limit: int = 10) -> str:
    """`; skipped (not Blocked or Failed): a (Done), b (not found)`, or "" for none."""
    if not skipped:
        return ""
    shown = ", ".join(f"{name} ({phase})" for name, phase in skipped[:limit])
    more = f", +{len(skipped) - limit} more" if len(skipped) > limit else ""
    return f"; skipped (not Blocked or Failed): {shown}{more}"
