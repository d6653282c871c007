"""The campaign's condition types and what each one says, decided from plain facts.

These are *desired* conditions: type, status, reason, message. Keeping lastTransitionTime and
observedGeneration is the job of `shardops.api.common.set_condition` (the one merge rule, with
metav1 semantics); the operator turns each desired condition into an `api.Condition` and merges it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardops.api.enums import CampaignPhase, ConditionReason, ConditionStatus, ConditionType
from shardops.logic.budget import BudgetGate, BudgetHold, BudgetStatus, HoldCause

# Lists in messages are cut so a condition stays readable; counts carry the full numbers.
MAX_LISTED_NAMES = 20


@dataclass(frozen=True)
class DesiredCondition:
    type: ConditionType
    status: ConditionStatus
    reason: ConditionReason
    message: str


def _flag(value: bool) -> ConditionStatus:
    return ConditionStatus.TRUE if value else ConditionStatus.FALSE


def listing(names: Sequence[str]) -> str:
    """` (a, b, +3 more)`, or "" for no names."""
    if not names:
        return ""
    shown = ", ".join(names[:MAX_LISTED_NAMES])
    more = f", +{len(names) - MAX_LISTED_NAMES} more" if len(names) > MAX_LISTED_NAMES else ""
    return f" ({shown}{more})"


def ready(problem_reason: ConditionReason | None, message: str) -> DesiredCondition:
    """False with the problem's reason when the spec or its items cannot be used; nothing is created then."""
    if problem_reason is None:
        return DesiredCondition(
            ConditionType.READY, ConditionStatus.TRUE, ConditionReason.SPEC_VALID, message
        )
    return DesiredCondition(ConditionType.READY, ConditionStatus.FALSE, problem_reason, message)


def backpressured(limit_message: str | None) -> DesiredCondition:
    """`limit_message` is the planner's backpressure limit (with its numbers), None when it held nothing."""
    if limit_message is None:
        return DesiredCondition(
            ConditionType.BACKPRESSURED,
            ConditionStatus.FALSE,
            ConditionReason.WITHIN_BACKLOG,
            "backlog below its bound",
        )
    return DesiredCondition(
        ConditionType.BACKPRESSURED, ConditionStatus.TRUE, ConditionReason.BACKLOG_FULL, limit_message
    )


def cluster_full(limit_message: str | None) -> DesiredCondition:
    if limit_message is None:
        return DesiredCondition(
            ConditionType.CLUSTER_FULL,
            ConditionStatus.FALSE,
            ConditionReason.WORKERS_SCHEDULED,
            "no worker pod stuck Pending",
        )
    return DesiredCondition(
        ConditionType.CLUSTER_FULL, ConditionStatus.TRUE, ConditionReason.WORKER_PODS_PENDING, limit_message
    )


def budget(status: BudgetStatus) -> tuple[DesiredCondition, DesiredCondition]:
    """BudgetWarning holds from the warn ratio on (also when exhausted); BudgetExhausted from the limit on."""
    text = status.describe()
    if status.limit is None:
        return (
            DesiredCondition(
                ConditionType.BUDGET_WARNING, ConditionStatus.FALSE, ConditionReason.NO_BUDGET, text
            ),
            DesiredCondition(
                ConditionType.BUDGET_EXHAUSTED, ConditionStatus.FALSE, ConditionReason.NO_BUDGET, text
            ),
        )
    warn = status.gate is not BudgetGate.OPEN
    exhausted = status.gate is BudgetGate.EXHAUSTED
    return (
        DesiredCondition(
            ConditionType.BUDGET_WARNING,
            _flag(warn),
            ConditionReason.WARN_RATIO_REACHED if warn else ConditionReason.WITHIN_BUDGET,
            f"{text}: only finalize shards start" if warn else text,
        ),
        DesiredCondition(
            ConditionType.BUDGET_EXHAUSTED,
            _flag(exhausted),
            ConditionReason.LIMIT_REACHED if exhausted else ConditionReason.WITHIN_BUDGET,
            f"{text}: unclaimed shards paused, running ones finish; raise spec.budget.limit to resume"
            if exhausted
            else text,
        ),
    )


_HOLD_REASONS = {
    HoldCause.WARN_RATIO: ConditionReason.WARN_RATIO_REACHED,
    HoldCause.LIMIT: ConditionReason.LIMIT_REACHED,
}


def budget_held(hold: BudgetHold | None, status: BudgetStatus, campaign: str = "") -> DesiredCondition:
    """True while work is left that the budget keeps from starting (the planner's `budget_hold`),
    with the fix: raise spec.budget.limit past the figure given, or accept the campaign as it is.
    The phase stays Running (Paused at the limit): the shards wait in Pending, claimable the moment
    the limit allows; this is what says that nothing more starts by itself."""
    if status.limit is None:
        return DesiredCondition(
            ConditionType.BUDGET_HELD, ConditionStatus.FALSE, ConditionReason.NO_BUDGET, status.describe()
        )
    if hold is None:
        return DesiredCondition(
            ConditionType.BUDGET_HELD,
            ConditionStatus.FALSE,
            ConditionReason.NOTHING_HELD,
            f"{status.describe()}: no work shard waits for the budget",
        )
    if hold.cause is HoldCause.NO_ROOM:
        reason = (
            ConditionReason.RESERVED_BY_RUNNING if hold.lifts_itself else ConditionReason.NO_ROOM_FOR_SHARD
        )
    else:
        reason = _HOLD_REASONS[hold.cause]
    return DesiredCondition(
        ConditionType.BUDGET_HELD, ConditionStatus.TRUE, reason, hold.describe(status, campaign or "CAMPAIGN")
    )


def degraded(
    failed: Sequence[str],
    failed_count: int,
    blocked: Sequence[str],
    blocked_count: int,
    campaign: str = "",
) -> DesiredCondition:
    if not failed_count and not blocked_count:
        return DesiredCondition(
            ConditionType.DEGRADED,
            ConditionStatus.FALSE,
            ConditionReason.NO_FAILURES,
            "no shard failed or blocked",
        )
    message = (
        f"{failed_count} failed{listing(failed)}, {blocked_count} blocked{listing(blocked)}; "
        f"fix the cause, then kubectl campaign retry {campaign or 'CAMPAIGN'} (--shard NAME for some)"
    )
    return DesiredCondition(
        ConditionType.DEGRADED, ConditionStatus.TRUE, ConditionReason.SHARDS_GAVE_UP, message
    )


def suspended(is_suspended: bool, hold: str | None = None) -> DesiredCondition:
    """`hold`: what suspends the campaign when spec.suspend does not (the error threshold)."""
    if is_suspended and hold:
        return DesiredCondition(
            ConditionType.SUSPENDED,
            ConditionStatus.TRUE,
            ConditionReason.HELD_BY_ERROR_THRESHOLD,
            f"{hold}: no claims, no new workers; running shards finish",
        )
    if is_suspended:
        return DesiredCondition(
            ConditionType.SUSPENDED,
            ConditionStatus.TRUE,
            ConditionReason.SPEC_SUSPEND,
            "spec.suspend is true: no claims, no new workers; running shards finish",
        )
    return DesiredCondition(
        ConditionType.SUSPENDED, ConditionStatus.FALSE, ConditionReason.ACTIVE, "not suspended"
    )


def stalled(stuck: Sequence[str]) -> DesiredCondition:
    if not stuck:
        return DesiredCondition(
            ConditionType.STALLED, ConditionStatus.FALSE, ConditionReason.PROGRESSING, "no shard is stuck"
        )
    return DesiredCondition(
        ConditionType.STALLED,
        ConditionStatus.TRUE,
        ConditionReason.NO_PROGRESS,
        f"{len(stuck)} running shard(s) heartbeat without progress{listing(stuck)}",
    )


def breaker_open(open_sources: Sequence[str]) -> DesiredCondition:
    if not open_sources:
        return DesiredCondition(
            ConditionType.BREAKER_OPEN, ConditionStatus.FALSE, ConditionReason.ALL_CLOSED, "no breaker open"
        )
    return DesiredCondition(
        ConditionType.BREAKER_OPEN,
        ConditionStatus.TRUE,
        ConditionReason.SOURCE_RATE_LIMITED,
        f"breaker open for{listing(open_sources)}: their shards wait or use the fallback",
    )


def complete(phase: CampaignPhase, progress: str) -> DesiredCondition:
    if phase is CampaignPhase.SUCCEEDED:
        return DesiredCondition(
            ConditionType.COMPLETE,
            ConditionStatus.TRUE,
            ConditionReason.SUCCEEDED,
            f"all {progress} shards done",
        )
    if phase is CampaignPhase.COMPLETED:
        return DesiredCondition(
            ConditionType.COMPLETE,
            ConditionStatus.TRUE,
            ConditionReason.COMPLETED_WITH_FAILURES,
            f"{progress} shards done; see Degraded",
        )
    return DesiredCondition(
        ConditionType.COMPLETE, ConditionStatus.FALSE, ConditionReason.IN_PROGRESS, f"{progress} shards done"
    )


def scheduled(identity: str, renewing: bool) -> DesiredCondition:
    """Which operator replica leads; False while its leader lease renewals are failing."""
    if renewing:
        return DesiredCondition(
            ConditionType.SCHEDULED,
            ConditionStatus.TRUE,
            ConditionReason.LEADER,
            f"scheduled by the leader {identity}",
        )
    return DesiredCondition(
        ConditionType.SCHEDULED,
        ConditionStatus.FALSE,
        ConditionReason.LEADER_RENEWAL_FAILING,
        f"leader {identity} cannot renew its lease; another replica may take over",
    )


def workers_failing(message: str | None) -> DesiredCondition:
    """True while new worker Jobs are held back because recent ones kept failing."""
    if message is None:
        return DesiredCondition(
            ConditionType.WORKERS_FAILING,
            ConditionStatus.FALSE,
            ConditionReason.WORKERS_HEALTHY,
            "workers are not failing",
        )
    return DesiredCondition(
        ConditionType.WORKERS_FAILING, ConditionStatus.TRUE, ConditionReason.WORKER_JOBS_FAILING, message
    )


def waiting_for_quota(queue_missing: str | None, waiting: str | None) -> DesiredCondition:
    """True while Kueue holds a worker Job suspended: for quota (QueuedByKueue, normal with a
    queue), or because spec.worker.queueName names no LocalQueue (LocalQueueNotFound, a fix)."""
    if queue_missing is not None:
        return DesiredCondition(
            ConditionType.WAITING_FOR_QUOTA,
            ConditionStatus.TRUE,
            ConditionReason.LOCAL_QUEUE_NOT_FOUND,
            queue_missing,
        )
    if waiting is not None:
        return DesiredCondition(
            ConditionType.WAITING_FOR_QUOTA, ConditionStatus.TRUE, ConditionReason.QUEUED_BY_KUEUE, waiting
        )
    return DesiredCondition(
        ConditionType.WAITING_FOR_QUOTA,
        ConditionStatus.FALSE,
        ConditionReason.NO_WORKER_QUEUED,
        "no worker Job waits in a queue",
    )


@dataclass(frozen=True)
class SourceProblem:
    """Why a campaign's source cannot use the shared Source its sourceRef names."""

    index: int  # in spec.sources
    reason: ConditionReason  # SourceNotFound or SourceNotAllowed
    fix: str  # what is wrong and what to do


def source_unresolved(problems: Sequence[SourceProblem]) -> DesiredCondition:
    """True while a sourceRef names a Source that does not exist or a ClusterSource that does not serve
    the campaign's namespace: that source's workers wait (nothing is lost) until it is fixed."""
    if not problems:
        return DesiredCondition(
            ConditionType.SOURCE_UNRESOLVED,
            ConditionStatus.FALSE,
            ConditionReason.SOURCES_RESOLVED,
            "no Source named in spec.sources[].sourceRef is missing or refuses this namespace",
        )
    ordered = sorted(problems, key=lambda p: p.index)
    message = "; ".join(f"spec.sources[{p.index}].sourceRef: {p.fix}" for p in ordered)
    return DesiredCondition(
        ConditionType.SOURCE_UNRESOLVED,
        ConditionStatus.TRUE,
        ordered[0].reason,
        f"{message}; its workers wait until then",
    )


def error_threshold(trip_message: str | None) -> DesiredCondition:
    """True (claims held) with the threshold, the class and an example shard; see logic.error_threshold."""
    if trip_message is None:
        return DesiredCondition(
            ConditionType.ERROR_THRESHOLD,
            ConditionStatus.FALSE,
            ConditionReason.WITHIN_ERROR_THRESHOLD,
            "non-retryable failures within spec.errorThreshold",
        )
    return DesiredCondition(
        ConditionType.ERROR_THRESHOLD, ConditionStatus.TRUE, ConditionReason.TOO_MANY_ERRORS, trip_message
    )
