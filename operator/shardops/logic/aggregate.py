"""Campaign status from its shards: counts, progress, spend, the campaign phase and its conditions."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from shardops.api.enums import CampaignPhase, ShardClass, ShardPhase
from shardops.logic.budget import BudgetGate, BudgetStatus, budget_status
from shardops.logic.conditions import Condition, ConditionStatus
from shardops.logic.views import ItemProgress, ShardView

# Status lists names so a person can jump to a shard; the counts carry the full size.
MAX_LISTED_NAMES = 20

_ACTIVE_PHASES = frozenset({CampaignPhase.PENDING, CampaignPhase.RUNNING, CampaignPhase.FINALIZING})
_FINISHED_PHASES = frozenset({CampaignPhase.SUCCEEDED, CampaignPhase.COMPLETED})


@dataclass(frozen=True)
class CampaignFacts:
    suspended: bool
    items: ItemProgress
    budget_limit: float | None
    budget_warn_ratio: float


@dataclass(frozen=True)
class Aggregate:
    """`counts` covers every phase (zeros included) and sums to the number of shards given.
    `total_shards` also counts shards not yet cut from the items, so progress does not jump back.
    """

    counts: Mapping[ShardPhase, int]
    total_shards: int
    progress_text: str
    oldest_pending_age: timedelta | None
    failed_count: int
    failed: tuple[str, ...]
    blocked_count: int
    blocked: tuple[str, ...]
    spent: float
    budget: BudgetStatus
    phase: CampaignPhase
    conditions: tuple[Condition, ...]


def aggregate(shards: Sequence[ShardView], now: datetime, facts: CampaignFacts) -> Aggregate:
    counts = count_phases(shards)
    spent = math.fsum(s.cost for s in shards)
    budget = budget_status(spent, facts.budget_limit, facts.budget_warn_ratio)
    phase = campaign_phase(shards, facts, budget.gate)
    total = len(shards) + facts.items.remaining_shards
    failed = _names_in(shards, ShardPhase.FAILED)
    blocked = _names_in(shards, ShardPhase.BLOCKED)
    progress = f"{counts[ShardPhase.DONE]}/{total}"
    return Aggregate(
        counts=counts,
        total_shards=total,
        progress_text=progress,
        oldest_pending_age=oldest_pending_age(shards, now),
        failed_count=len(failed),
        failed=tuple(failed[:MAX_LISTED_NAMES]),
        blocked_count=len(blocked),
        blocked=tuple(blocked[:MAX_LISTED_NAMES]),
        spent=spent,
        budget=budget,
        phase=phase,
        conditions=campaign_conditions(
            phase, progress=progress, failed=failed, blocked=blocked, budget=budget, suspended=facts.suspended
        ),
    )


def count_phases(shards: Sequence[ShardView]) -> dict[ShardPhase, int]:
    tally = Counter(s.phase for s in shards)
    return {phase: tally.get(phase, 0) for phase in ShardPhase}


def oldest_pending_age(shards: Sequence[ShardView], now: datetime) -> timedelta | None:
    """How long the longest-waiting Pending shard has waited: a starvation and routing signal."""
    since = [s.since for s in shards if s.phase is ShardPhase.PENDING]
    if not since:
        return None
    return max(timedelta(0), now - min(since))


def campaign_phase(shards: Sequence[ShardView], facts: CampaignFacts, gate: BudgetGate) -> CampaignPhase:
    if facts.suspended:
        return CampaignPhase.SUSPENDED
    all_cut = facts.items.remaining_shards == 0
    if all_cut and all(s.phase.terminal for s in shards):
        # Failed or Blocked shards make the campaign Completed, never Succeeded: a blocked shard is not done.
        return (
            CampaignPhase.SUCCEEDED
            if all(s.phase is ShardPhase.DONE for s in shards)
            else CampaignPhase.COMPLETED
        )
    if gate is BudgetGate.EXHAUSTED:
        return CampaignPhase.PAUSED
    if all_cut and all(s.phase.terminal for s in shards if s.shard_class is ShardClass.WORK):
        return CampaignPhase.FINALIZING
    if not any(_started(s) for s in shards):
        return CampaignPhase.PENDING
    return CampaignPhase.RUNNING


def _started(shard: ShardView) -> bool:
    return shard.phase is ShardPhase.RUNNING or shard.phase.terminal or shard.attempt > 1


def _names_in(shards: Sequence[ShardView], phase: ShardPhase) -> list[str]:
    return sorted(s.name for s in shards if s.phase is phase)


def campaign_conditions(
    phase: CampaignPhase,
    *,
    progress: str,
    failed: Sequence[str],
    blocked: Sequence[str],
    budget: BudgetStatus,
    suspended: bool,
) -> tuple[Condition, ...]:
    return (
        _progressing(phase, progress),
        _complete(phase, progress),
        _degraded(failed, blocked),
        _budget_limited(budget),
        _suspended(suspended),
    )


def _flag(value: bool) -> ConditionStatus:
    return ConditionStatus.TRUE if value else ConditionStatus.FALSE


def _progressing(phase: CampaignPhase, progress: str) -> Condition:
    return Condition("Progressing", _flag(phase in _ACTIVE_PHASES), str(phase), f"{progress} shards done")


def _complete(phase: CampaignPhase, progress: str) -> Condition:
    if phase is CampaignPhase.SUCCEEDED:
        return Condition("Complete", ConditionStatus.TRUE, "Succeeded", f"all {progress} shards done")
    if phase is CampaignPhase.COMPLETED:
        return Condition(
            "Complete", ConditionStatus.TRUE, "CompletedWithFailures", f"{progress} shards done; see Degraded"
        )
    return Condition("Complete", ConditionStatus.FALSE, "InProgress", f"{progress} shards done")


def _degraded(failed: Sequence[str], blocked: Sequence[str]) -> Condition:
    if not failed and not blocked:
        return Condition("Degraded", ConditionStatus.FALSE, "NoFailures", "no shard failed or blocked")
    message = f"{len(failed)} failed{_listing(failed)}, {len(blocked)} blocked{_listing(blocked)}"
    return Condition("Degraded", ConditionStatus.TRUE, "ShardsFailed", message)


def _listing(names: Sequence[str]) -> str:
    if not names:
        return ""
    shown = ", ".join(names[:MAX_LISTED_NAMES])
    more = f", +{len(names) - MAX_LISTED_NAMES} more" if len(names) > MAX_LISTED_NAMES else ""
    return f" ({shown}{more})"


_BUDGET_REASONS = {
    BudgetGate.OPEN: "WithinBudget",
    BudgetGate.WARN: "BudgetWarning",
    BudgetGate.EXHAUSTED: "BudgetExhausted",
}


def _budget_limited(budget: BudgetStatus) -> Condition:
    limited = budget.gate is not BudgetGate.OPEN
    return Condition("BudgetLimited", _flag(limited), _BUDGET_REASONS[budget.gate], budget.describe())


def _suspended(suspended: bool) -> Condition:
    if suspended:
        return Condition(
            "Suspended", ConditionStatus.TRUE, "Suspended", "spec.suspend is set: nothing starts"
        )
    return Condition("Suspended", ConditionStatus.FALSE, "Active", "not suspended")
