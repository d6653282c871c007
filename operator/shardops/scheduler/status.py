"""The Campaign status a pass wants (`desired_status`), computed from what it observed and decided.
Pure: no I/O, no clock (`now` is a parameter). The reconcile only compares it with the status the
Campaign has and patches when they differ (compute, then patch).

Also pure and here: the status of a Campaign that cannot be used (`invalid_status`), and which
turned conditions a person should hear about (`turned`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from shardops.api.campaign import CampaignStatus
from shardops.api.common import JSON, Condition
from shardops.api.enums import BreakerState, CampaignPhase, ConditionReason, ConditionStatus, ConditionType
from shardops.api.folded import FoldedShards
from shardops.api.shard import Shard
from shardops.logic import conditions
from shardops.logic.breaker import effective
from shardops.logic.conditions import DesiredCondition
from shardops.logic.planner import DispatchPlan, LimitReason
from shardops.scheduler import builders
from shardops.scheduler.history import HistoryFold
from shardops.scheduler.observed import Observed
from shardops.state import breakers, cooldowns, ledger
from shardops.state.summary import Summary, summarize


@dataclass(frozen=True)
class Desired:
    """The status a pass wants, the conditions in it (merged with the previous ones), and the
    summary it was computed from (for the metrics)."""

    status: CampaignStatus
    conditions: list[Condition]
    summary: Summary


@dataclass(frozen=True)
class Decided:
    """What the pass decided that the status records besides what it observed."""

    plan: DispatchPlan
    fold: HistoryFold
    # The stuck shards the sweep found (the Stalled condition).
    stuck: Sequence[str]
    # The retry request acted on this pass (status.lastRetryGeneration), or None.
    retry_generation: int | None
    # The finished shards this pass's ledger segment holds, and status.folded with them.
    to_fold: Sequence[Shard]
    folded: FoldedShards
    # Which operator schedules the campaign, and whether its leadership is being renewed.
    identity: str
    renewing: bool
    # What keeps a source of it from its shared Source (scheduler/sources.py), by source name.
    # The ErrorThreshold condition the pass decided before it planned (`error_threshold_condition`).
    error_threshold: conditions.DesiredCondition
    source_problems: Mapping[str, conditions.SourceProblem] = dataclasses.field(default_factory=dict)


def desired_status(seen: Observed, decided: Decided, now: dt.datetime) -> Desired:
    campaign = seen.campaign
    spec = campaign.spec
    previous = campaign.current_status
    folded = decided.folded
    gone = {s.name for s in decided.to_fold}
    live = [s for s in seen.shards.values() if s.name not in gone]
    summary = summarize(campaign, live, len(seen.items), now, folded)
    agg, facts = summary.aggregate, summary.facts
    limits = {limit.reason: limit.message for limit in decided.plan.limits}
    fold = decided.fold
    open_sources = [
        source
        for source, b in fold.states.items()
        if effective(b, now, breakers.cooldown_of(spec, source)) is not BreakerState.CLOSED
    ]
    work_total = spec.expected_shards(len(seen.items))
    desired: list[DesiredCondition] = [
        conditions.ready(None, f"{len(seen.items)} item(s) in {work_total} shard(s) of {spec.shard_size}"),
        conditions.backpressured(limits.get(LimitReason.BACKPRESSURE)),
        conditions.cluster_full(limits.get(LimitReason.CLUSTER_FULL)),
        *agg.conditions,
        conditions.budget_held(decided.plan.budget_hold, agg.budget, campaign.name),
        conditions.stalled(sorted(decided.stuck)),
        conditions.breaker_open(sorted(open_sources)),
        conditions.scheduled(decided.identity, decided.renewing),
        conditions.workers_failing(limits.get(LimitReason.WORKERS_FAILING)),
        conditions.waiting_for_quota(
            limits.get(LimitReason.QUEUE_NOT_FOUND), limits.get(LimitReason.WAITING_FOR_QUOTA)
        ),
        decided.error_threshold,
    ]
    if any(source.source_ref is not None for source in spec.sources or []):
        desired.append(conditions.source_unresolved(list(decided.source_problems.values())))
    merged = builders.merge_conditions(previous.conditions, desired, now, campaign.generation)
    retry_generation = decided.retry_generation
    new = builders.campaign_status(
        agg,
        builders.StatusFacts(
            generation=campaign.generation,
            items_total=len(seen.items),
            work_shards_total=work_total,
            has_finalize=spec.finalize is not None,
            uncut_shards=facts.uncut_shards,
            cut_shards=-(-facts.items.cut_items // spec.shard_size),
            materialized=len(live) + folded.total,
            breakers=builders.breakers_to_status(spec, fold.states, fold.reasons, previous, now),
            conditions=merged,
            last_retry_generation=(
                retry_generation if retry_generation is not None else previous.last_retry_generation
            ),
            history_folded={name: seq for name, seq in fold.marks.items() if name not in gone},
            history_folded_until=fold.watermark,
            budget_limit=spec.budget.limit if spec.budget is not None else None,
        ),
        previous,
    ).model_copy(
        update={
            "folded": folded,
            "tokens": ledger.campaign_tokens(previous.tokens, folded, live),
            "items_errored": ledger.campaign_errored_items(folded, live) or None,
            # For workers mid-shard, which read the Campaign at heartbeat but list no shards.
            "source_cooldowns": cooldowns.status_list(cooldowns.source_cooldowns(campaign, live, now)),
        }
    )
    return Desired(new, merged, summary)


def invalid_status(
    body: JSON, reason: ConditionReason, message: str, now: dt.datetime
) -> tuple[CampaignStatus, CampaignStatus]:
    """The status a Campaign that cannot be used has (phase Invalid, Ready=False naming the fix),
    with the status it has now (or an empty one when that does not parse)."""
    try:
        previous = CampaignStatus.model_validate(body.get("status") or {})
    except ValidationError:
        previous = CampaignStatus()
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    merged = builders.merge_conditions(
        previous.conditions, [conditions.ready(reason, message)], now, generation
    )
    new = previous.model_copy(
        update={"phase": CampaignPhase.INVALID, "observed_generation": generation, "conditions": merged}
    )
    return previous, new


def validation_message(error: ValidationError) -> str:
    """What is wrong with a Campaign's spec, at most ten problems, and the fix."""
    problems = []
    for item in error.errors()[:10]:
        where = ".".join(str(part) for part in item.get("loc", ()) if part != "__root__")
        problems.append(f"{where or 'spec'}: {item.get('msg')}")
    more = f" (+{error.error_count() - 10} more)" if error.error_count() > 10 else ""
    return "fix the Campaign (kubectl edit campaign): " + "; ".join(problems) + more


# Conditions a person should hear about when they turn True.
_LOUD = frozenset(
    str(kind)
    for kind in (
        ConditionType.BUDGET_WARNING,
        ConditionType.BUDGET_EXHAUSTED,
        ConditionType.CLUSTER_FULL,
        ConditionType.SUSPENDED,
        ConditionType.COMPLETE,
        ConditionType.DEGRADED,
        ConditionType.WORKERS_FAILING,
        ConditionType.ERROR_THRESHOLD,
    )
)
# And those heard about only with one reason, when they take it. BudgetHeld: only when nothing
# running can lift it (at the warn ratio and the limit the two budget conditions above speak, and
# ReservedByRunning clears itself as running shards finish); it usually comes after
# ReservedByRunning, True all along, hence "takes the reason" rather than "turns True".
# WaitingForQuota: only when the LocalQueue named does not exist (waiting for quota is what a queue is for).
# SourceUnresolved: each reason it takes (a Source missing, or not serving the namespace), both fixes.
_LOUD_REASONS = frozenset(
    {
        (str(ConditionType.BUDGET_HELD), str(ConditionReason.NO_ROOM_FOR_SHARD)),
        (str(ConditionType.WAITING_FOR_QUOTA), str(ConditionReason.LOCAL_QUEUE_NOT_FOUND)),
        (str(ConditionType.SOURCE_UNRESOLVED), str(ConditionReason.SOURCE_NOT_FOUND)),
        (str(ConditionType.SOURCE_UNRESOLVED), str(ConditionReason.SOURCE_NOT_ALLOWED)),
    }
)


def turned(before: Sequence[Condition], after: Sequence[Condition]) -> list[Condition]:
    """The conditions of `after` a person should hear about (an Event each): those that turned True
    (or took a loud reason) since `before`."""
    old = {c.type: c for c in before}
    return [condition for condition in after if news(old.get(condition.type), condition)]


def news(was: Condition | None, now: Condition) -> bool:
    if now.status != str(ConditionStatus.TRUE):
        return False
    if now.type in _LOUD:
        return was is None or was.status != now.status
    if (now.type, now.reason) in _LOUD_REASONS:
        return was is None or (was.status, was.reason) != (now.status, now.reason)
    return False
