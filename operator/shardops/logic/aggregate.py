"""Campaign status from its shards: counts, progress, spend, the campaign phase and its conditions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from shardops.api.enums import CampaignPhase, ShardClass, ShardPhase
from shardops.logic import conditions
from shardops.logic.budget import BudgetGate, BudgetStatus, budget_status
from shardops.logic.conditions import MAX_LISTED_NAMES, DesiredCondition
from shardops.logic.shardview import ItemProgress, ShardView


@dataclass(frozen=True)
class CampaignFacts:
    """`finalize_pending`: a finalize step is configured but its shard does not exist yet, so the
    campaign is not finished even when every existing shard is.
    `previous_spent`: what the status already says was spent; spend never goes down, even if a
    shard's reported cost is lost (an edited or deleted Shard cannot un-spend money).
    `campaign`: the campaign's name, for the commands the conditions suggest.
    """

    suspended: bool
    items: ItemProgress
    budget_limit: Decimal | None
    budget_warn_ratio: float
    finalize_pending: bool = False
    previous_spent: Decimal = Decimal(0)
    campaign: str = ""
    # Shards already folded into the ledger (their Shard objects are gone): counted in their phase,
    # their cost counted in what was spent.
    folded_done: int = 0
    folded_failed: int = 0
    folded_blocked: int = 0
    folded_cost: Decimal = Decimal(0)
    # What suspends the campaign when spec.suspend does not (the error threshold's hold), for texts.
    hold: str | None = None
    # spec.budget.maxPerShard: with a limit, work shards reserve it at the claim (logic.budget).
    budget_max_per_shard: Decimal | None = None

    @property
    def folded_gave_up(self) -> int:
        return self.folded_failed + self.folded_blocked

    @property
    def folded_shards(self) -> int:
        return self.folded_done + self.folded_gave_up

    @property
    def uncut_shards(self) -> int:
        """Shards still to be created: work shards not yet cut from the items, and the finalize shard."""
        return self.items.uncut_shards + (1 if self.finalize_pending else 0)


@dataclass(frozen=True)
class Aggregate:
    """`counts` covers every phase (zeros included) and sums to the number of shards given.
    `total_shards` also counts shards not yet cut from the items (and a pending finalize shard),
    so progress does not jump back.
    """

    counts: Mapping[ShardPhase, int]
    total_shards: int
    progress_text: str
    oldest_pending_age: timedelta | None
    failed_count: int
    failed: tuple[str, ...]
    blocked_count: int
    blocked: tuple[str, ...]
    spent: Decimal
    budget: BudgetStatus
    phase: CampaignPhase
    conditions: tuple[DesiredCondition, ...]


def aggregate(shards: Sequence[ShardView], now: datetime, facts: CampaignFacts) -> Aggregate:
    counts = count_phases(shards)
    counts[ShardPhase.DONE] += facts.folded_done
    counts[ShardPhase.FAILED] += facts.folded_failed
    counts[ShardPhase.BLOCKED] += facts.folded_blocked
    spent = max(facts.previous_spent, facts.folded_cost + sum((s.cost for s in shards), Decimal(0)))
    budget = budget_status(spent, facts.budget_limit, facts.budget_warn_ratio, facts.budget_max_per_shard)
    phase = campaign_phase(shards, facts, budget.gate)
    total = len(shards) + facts.uncut_shards + facts.folded_shards
    # Names of the live ones (the newest gave-up shards); the counts include the folded ones.
    failed = _names_in(shards, ShardPhase.FAILED)
    blocked = _names_in(shards, ShardPhase.BLOCKED)
    failed_count = counts[ShardPhase.FAILED]
    blocked_count = counts[ShardPhase.BLOCKED]
    progress = f"{counts[ShardPhase.DONE]}/{total}"
    return Aggregate(
        counts=counts,
        total_shards=total,
        progress_text=progress,
        oldest_pending_age=oldest_pending_age(shards, now),
        failed_count=failed_count,
        failed=tuple(failed[:MAX_LISTED_NAMES]),
        blocked_count=blocked_count,
        blocked=tuple(blocked[:MAX_LISTED_NAMES]),
        spent=spent,
        budget=budget,
        phase=phase,
        conditions=(
            conditions.complete(phase, progress),
            conditions.degraded(failed, failed_count, blocked, blocked_count, facts.campaign),
            *conditions.budget(budget),
            conditions.suspended(facts.suspended, facts.hold),
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
    work_cut = facts.items.uncut_shards == 0
    if work_cut and not facts.finalize_pending and all(s.phase.terminal for s in shards):
        # Failed or Blocked shards (live or folded) make the campaign Completed, never Succeeded: a
        # blocked shard is not done.
        return (
            CampaignPhase.SUCCEEDED
            if all(s.phase is ShardPhase.DONE for s in shards) and not facts.folded_gave_up
            else CampaignPhase.COMPLETED
        )
    if gate is BudgetGate.EXHAUSTED:
        return CampaignPhase.PAUSED
    if work_cut and all(s.phase.terminal for s in shards if s.shard_class is ShardClass.WORK):
        return CampaignPhase.FINALIZING
    if not facts.folded_shards and not any(_started(s) for s in shards):
        return CampaignPhase.PENDING
    return CampaignPhase.RUNNING


def _started(shard: ShardView) -> bool:
    return shard.phase is ShardPhase.RUNNING or shard.phase.terminal or shard.attempt > 1


def _names_in(shards: Sequence[ShardView], phase: ShardPhase) -> list[str]:
    return sorted(s.name for s in shards if s.phase is phase)
