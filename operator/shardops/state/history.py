"""Fold the shards' transition history into breakers and counters, each entry exactly once.

Workers write failures and completions into shard history; the operator reads them back in time
order and feeds `logic.breaker`. Entries already folded are skipped: per shard by the newest entry
this process folded (exact while it leads), and across leaders by `status.historyFoldedUntil`, the
newest entry time any leader folded (a new leader continues from there).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

from shardops.api.enums import BreakerState, ErrorClass
from shardops.api.shard import Shard
from shardops.logic.breaker import (
    CLOSED_BREAKER,
    BreakerPolicy,
    SourceBreaker,
    record_failure,
    record_success,
)
from shardops.logic.transitions import EventReason

_FAILURE_REASONS = frozenset({EventReason.ATTEMPT_FAILED, EventReason.FAILED, EventReason.BLOCKED})


@dataclass(frozen=True)
class Outcome:
    """One history entry, flattened: what happened to which shard, on which source, when."""

    at: dt.datetime
    shard: str
    reason: str
    attempt: int
    source: str | None
    error_class: ErrorClass | None


def new_outcomes(
    shards: Iterable[Shard], folded: Mapping[str, dt.datetime], watermark: dt.datetime | None
) -> list[Outcome]:
    """Entries not folded yet, oldest first (ties broken by shard name, so the order is stable)."""
    found: list[Outcome] = []
    for shard in shards:
        since = folded.get(shard.name, watermark)
        for entry in shard.current_status.history:
            if since is not None and entry.at <= since:
                continue
            found.append(
                Outcome(
                    at=entry.at,
                    shard=shard.name,
                    reason=entry.reason,
                    attempt=entry.attempt,
                    source=entry.source,
                    error_class=entry.error_class,
                )
            )
    found.sort(key=lambda o: (o.at, o.shard))
    return found


def watermark_after(watermark: dt.datetime | None, outcomes: Iterable[Outcome]) -> dt.datetime | None:
    """The campaign-wide watermark once `outcomes` are folded: the newest entry time, never back."""
    newest = watermark
    for outcome in outcomes:
        if newest is None or outcome.at > newest:
            newest = outcome.at
    return newest


def mark_folded(
    folded: MutableMapping[str, dt.datetime], watermark: dt.datetime | None, outcomes: Sequence[Outcome]
) -> dt.datetime | None:
    """Remember the newest folded entry per shard; the new campaign-wide watermark. The operator
    calls it once the status recording the fold is written (a fold whose write is lost is redone)."""
    for outcome in outcomes:
        if outcome.shard not in folded or outcome.at > folded[outcome.shard]:
            folded[outcome.shard] = outcome.at
    return watermark_after(watermark, outcomes)


@dataclass
class BreakerFold:
    states: dict[str, SourceBreaker]
    opened: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)


def fold_breakers(
    states: Mapping[str, SourceBreaker],
    outcomes: Iterable[Outcome],
    policy_of: Mapping[str, BreakerPolicy],
    default: BreakerPolicy,
) -> BreakerFold:
    """Feed failures and successes, in time order, to each source's breaker (`logic.breaker` decides)."""
    result = BreakerFold(states=dict(states))
    for outcome in outcomes:
        if outcome.source is None:
            continue
        policy = policy_of.get(outcome.source, default)
        before = result.states.get(outcome.source, CLOSED_BREAKER)
        if outcome.reason in _FAILURE_REASONS and outcome.error_class is not None:
            after = record_failure(before, outcome.error_class, outcome.at, policy)
        elif outcome.reason == EventReason.COMPLETED:
            after = record_success(before, outcome.at, policy)
        else:
            continue
        result.states[outcome.source] = after
        if before.state is BreakerState.CLOSED and after.state is BreakerState.OPEN:
            result.opened.append(outcome.source)
            result.reasons[outcome.source] = (
                f"{after.consecutive_rate_limited} consecutive {outcome.error_class} failures, "
                f"last on shard {outcome.shard} attempt {outcome.attempt}"
            )
        elif before.state is BreakerState.OPEN and after.state is BreakerState.CLOSED:
            result.closed.append(outcome.source)
    return result


@dataclass(frozen=True)
class Tally:
    """Counters for metrics: how many of each thing happened among the new entries."""

    claims: int
    lease_expirations: int
    blocked: int
    retries: Mapping[str, int]
    failed: Mapping[str, int]


def tally(outcomes: Iterable[Outcome]) -> Tally:
    claims = expirations = blocked = 0
    retries: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for o in outcomes:
        cls = str(o.error_class or ErrorClass.UNKNOWN)
        if o.reason == EventReason.CLAIMED:
            claims += 1
        elif o.reason == EventReason.LEASE_EXPIRED:
            expirations += 1
        elif o.reason == EventReason.BLOCKED:
            blocked += 1
        elif o.reason == EventReason.ATTEMPT_FAILED:
            retries[cls] += 1
        elif o.reason == EventReason.FAILED:
            failed[cls] += 1
    return Tally(claims, expirations, blocked, dict(retries), dict(failed))
