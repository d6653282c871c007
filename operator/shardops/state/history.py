"""Fold the shards' transition history into breakers and counters, each entry exactly once.

Workers and the operator append transitions to shard history, each entry numbered one above the
shard's previous entry (`HistoryEntry.sequence`, `ShardStatus.with_history`); the operator reads
them back and feeds `logic.breaker`. Which entries are new is decided by sequence, never by time:
per shard, the entries above the sequence folded last (`status.historyFolded`, written by the
status write that records the fold, so a new leader continues from it and a fold whose write is
lost is done again). The writers' clocks play no part in it, so an entry written by a worker whose
clock lags, or around a failover, is folded like any other.

A status written by a release before `historyFolded` has only `historyFoldedUntil`, the newest entry
time folded: on the first fold after the upgrade a shard's entries up to that time are taken as
folded (the old rule, applied once), and from then on its sequence decides.

Across shards, the new entries are fed to the breakers in time order (ties by shard name, then
sequence), so a breaker's consecutive-failure count follows the order the failures happened in as
well as the clocks tell it; time orders the entries, it never skips one.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping
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
    sequence: int
    reason: str
    attempt: int
    source: str | None
    error_class: ErrorClass | None


def new_outcomes(
    shards: Iterable[Shard], folded: Mapping[str, int] | None, legacy_until: dt.datetime | None = None
) -> list[Outcome]:
    """The entries not folded yet, oldest first (ties by shard name, then sequence: a stable order).

    `folded`: the sequence folded last per shard (`status.historyFolded`); a shard it does not name
    has had nothing folded. None for a status from before sequences: then `legacy_until`
    (`status.historyFoldedUntil`) says which entries the earlier release folded, by time.
    """
    found: list[Outcome] = []
    for shard in shards:
        status = shard.current_status
        mark = folded_sequence(shard, folded)
        by_time = legacy_until if folded is None else None
        for sequence, entry in zip(status.sequences(), status.history, strict=True):
            if sequence <= mark or (by_time is not None and entry.at <= by_time):
                continue
            found.append(
                Outcome(
                    at=entry.at,
                    shard=shard.name,
                    sequence=sequence,
                    reason=entry.reason,
                    attempt=entry.attempt,
                    source=entry.source,
                    error_class=entry.error_class,
                )
            )
    found.sort(key=lambda o: (o.at, o.shard, o.sequence))
    return found


def folded_sequence(shard: Shard, folded: Mapping[str, int] | None) -> int:
    """The sequence of `shard`'s history folded last: `folded`'s entry for its name, or 0.

    A recorded sequence above the shard's newest one, on a history that still begins with the
    entry numbered 1 by its writer, was another Shard's of the same name (deleted, then cut again:
    the finalize shard of a campaign whose Done finalize shard was deleted by hand): this one has had
    nothing folded. The operator reads the Campaign before it lists the Shards, so its copy of a
    shard is never older than the sequence recorded for it; a reader whose copy of a shard lags
    the Campaign (a worker's watch) may count that shard's entries a second time in its own view of
    the breakers until its copy catches up. A history without that first entry (cut at
    HISTORY_LIMIT, or rewritten by an earlier release without numbers) keeps the recorded sequence:
    never counted twice."""
    mark = (folded or {}).get(shard.name, 0)
    status = shard.current_status
    if mark > status.last_sequence and status.history and status.history[0].sequence == 1:
        return 0
    return mark


def folded_marks(shards: Iterable[Shard], folded: Mapping[str, int] | None) -> dict[str, int]:
    """`status.historyFolded` once the new entries of `shards` are folded: each shard with history at
    its newest entry's sequence (never below the mark it had), and only `shards` — the live ones
    the caller passes, so shards folded into the ledger and deleted leave the map and it stays as
    small as the window of live Shards."""
    marks: dict[str, int] = {}
    for shard in shards:
        top = max(shard.current_status.last_sequence, folded_sequence(shard, folded))
        if top > 0:
            marks[shard.name] = top
    return marks


def watermark_after(watermark: dt.datetime | None, outcomes: Iterable[Outcome]) -> dt.datetime | None:
    """`status.historyFoldedUntil` (deprecated, for readers of earlier releases) once `outcomes` are
    folded: the newest entry time, never back."""
    newest = watermark
    for outcome in outcomes:
        if newest is None or outcome.at > newest:
            newest = outcome.at
    return newest


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
