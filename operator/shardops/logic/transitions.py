"""The shard state machine (docs/architecture.md, "Shard state machine") as one table: which action
moves which phase where, what it records.

Operator and worker both go through `transition`, so a phase change and its event reason can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from shardops.api.enums import ShardPhase


class Action(StrEnum):
    MATERIALIZE = "Materialize"
    CLAIM = "Claim"
    COMPLETE = "Complete"
    FAIL_RETRYABLE = "FailRetryable"
    FAIL_FINAL = "FailFinal"
    BLOCK = "Block"
    RECLAIM = "Reclaim"
    RELEASE = "Release"
    PAUSE = "Pause"
    RESUME = "Resume"
    RETRY = "Retry"
    RETRY_ERRORED = "RetryErrored"
    REVOKE = "Revoke"


class EventReason(StrEnum):
    """Kubernetes Event reasons (and status.history reasons) for shards."""

    MATERIALIZED = "Materialized"
    CLAIMED = "Claimed"
    COMPLETED = "Completed"
    ATTEMPT_FAILED = "AttemptFailed"
    FAILED = "Failed"
    BLOCKED = "Blocked"
    LEASE_EXPIRED = "LeaseExpired"
    RELEASED = "Released"
    PAUSED = "Paused"
    RESUMED = "Resumed"
    RETRIED = "Retried"
    ERRORED_RETRIED = "ErroredRetried"
    REVOKED = "Revoked"
    # Not a transition: emitted when a lease is classified STUCK and the stall policy only reports.
    STALLED = "Stalled"


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class AttemptEffect(StrEnum):
    KEEP = "keep"
    # The attempt was used up: the next claim is attempt+1.
    CHARGE = "charge"
    # An explicit retry gives the shard a fresh set of attempts; history keeps the old count.
    RESET = "reset"


@dataclass(frozen=True)
class Rule:
    sources: frozenset[ShardPhase]
    target: ShardPhase
    reason: EventReason
    event_type: EventType
    attempt: AttemptEffect
    # Whether the campaign's Event for the reason counts it (`k8s.events.EventSeries`, one Event per
    # campaign and reason, not per shard). Events are for what a person must see (a failed attempt,
    # a reclaim, a block, a retry, a revoke); routine transitions live in the shard's history and in
    # the metrics, which keeps a shard's lifecycle to a handful of API writes.
    event: bool


_P = ShardPhase
_N, _W = EventType.NORMAL, EventType.WARNING
_KEEP, _CHARGE, _RESET = AttemptEffect.KEEP, AttemptEffect.CHARGE, AttemptEffect.RESET
_RUNNING = frozenset({_P.RUNNING})

_QUIET, _LOUD = False, True

TRANSITIONS: dict[Action, Rule] = {
    Action.MATERIALIZE: Rule(frozenset({_P.QUEUED}), _P.PENDING, EventReason.MATERIALIZED, _N, _KEEP, _QUIET),
    Action.CLAIM: Rule(frozenset({_P.PENDING}), _P.RUNNING, EventReason.CLAIMED, _N, _KEEP, _QUIET),
    Action.COMPLETE: Rule(_RUNNING, _P.DONE, EventReason.COMPLETED, _N, _KEEP, _QUIET),
    Action.FAIL_RETRYABLE: Rule(_RUNNING, _P.PENDING, EventReason.ATTEMPT_FAILED, _W, _CHARGE, _LOUD),
    Action.FAIL_FINAL: Rule(_RUNNING, _P.FAILED, EventReason.FAILED, _W, _KEEP, _LOUD),
    Action.BLOCK: Rule(_RUNNING, _P.BLOCKED, EventReason.BLOCKED, _W, _KEEP, _LOUD),
    Action.RECLAIM: Rule(_RUNNING, _P.PENDING, EventReason.LEASE_EXPIRED, _W, _CHARGE, _LOUD),
    # A graceful shutdown is not the shard's fault, so it does not use up an attempt.
    Action.RELEASE: Rule(_RUNNING, _P.PENDING, EventReason.RELEASED, _N, _KEEP, _QUIET),
    # Budget and suspend are told once, on the Campaign (its BudgetExhausted/Suspended conditions).
    Action.PAUSE: Rule(frozenset({_P.PENDING, _P.QUEUED}), _P.PAUSED, EventReason.PAUSED, _N, _KEEP, _QUIET),
    Action.RESUME: Rule(frozenset({_P.PAUSED}), _P.PENDING, EventReason.RESUMED, _N, _KEEP, _QUIET),
    # Done is never retried: its result is stored under the idempotency key and would just be returned.
    Action.RETRY: Rule(
        frozenset({_P.FAILED, _P.BLOCKED}), _P.PENDING, EventReason.RETRIED, _N, _RESET, _LOUD
    ),
    # A Done shard with errored items runs just those again (status.rerunErrored): its result is the
    # one they errored in, read for the others' results, never returned as the new one.
    Action.RETRY_ERRORED: Rule(
        frozenset({_P.DONE}), _P.PENDING, EventReason.ERRORED_RETRIED, _N, _RESET, _LOUD
    ),
    Action.REVOKE: Rule(_RUNNING, _P.PENDING, EventReason.REVOKED, _W, _CHARGE, _LOUD),
}


class IllegalTransition(ValueError):
    def __init__(self, current: ShardPhase, action: Action) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[action].sources))
        self.current = current
        self.action = action
        self.reason = f"{action} is not allowed from {current} (only from {allowed})"
        super().__init__(self.reason)


def can_transition(current: ShardPhase, action: Action) -> bool:
    return current in TRANSITIONS[action].sources


def transition(current: ShardPhase, action: Action) -> ShardPhase:
    """The phase after `action`; raises IllegalTransition instead of guessing."""
    rule = TRANSITIONS[action]
    if current not in rule.sources:
        raise IllegalTransition(current, action)
    return rule.target


def next_attempt(attempt: int, action: Action) -> int:
    effect = TRANSITIONS[action].attempt
    if effect is AttemptEffect.CHARGE:
        return attempt + 1
    if effect is AttemptEffect.RESET:
        return 1
    return attempt


def event_reason(action: Action) -> EventReason:
    return TRANSITIONS[action].reason


def event_type(action: Action) -> EventType:
    return TRANSITIONS[action].event_type


def records_event(action: Action) -> bool:
    """True when a Kubernetes Event records the transition (see `Rule.event`)."""
    return TRANSITIONS[action].event


def counted_reasons() -> dict[EventReason, EventType]:
    """The reasons a campaign's Event series counts (`Rule.event`), with their Event type."""
    return {rule.reason: rule.event_type for rule in TRANSITIONS.values() if rule.event}
