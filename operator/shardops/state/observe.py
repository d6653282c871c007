"""What the scheduler sees: live objects (Campaign, Shards, Leases, worker Jobs and Pods) turned into
the inputs of `logic.planner.plan_dispatch`. Pure: no I/O, no clock (`now` is a parameter).

One home for this mapping. `kubectl campaign plan` (a dry run) calls it with what it read from the
API server, so its answer is the operator's: the reconcile's `_plan` builds exactly these inputs
(see `tests/cli/test_campaign_plan.py`, which checks the two agree). The worker chooses its claims
from `claim_inputs`, which is `dispatch_inputs` too: per-source cooldowns, fallbacks, the budget
gate and every other gate are computed once, here, for all three.

A process that just became the leader has folded nothing yet: `breaker_states` is what it computes
from the status and the shard history not yet folded. A running operator passes its own fold.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from shardops.api.campaign import Budget, Campaign, CampaignSpec
from shardops.api.common import JSON
from shardops.api.enums import ConditionStatus, ConditionType, ShardClass, ShardPhase
from shardops.api.folded import FoldedShards
from shardops.api.shard import Shard
from shardops.logic.aggregate import CampaignFacts
from shardops.logic.breaker import SourceBreaker
from shardops.logic.budget import BudgetStatus, budget_status
from shardops.logic.leases import LeaseVerdict, classify_lease, lease_action
from shardops.logic.planner import DispatchInputs, DispatchLimits
from shardops.logic.queues import QueueState
from shardops.logic.shardview import ItemProgress, ShardView
from shardops.logic.transitions import Action
from shardops.state import cooldowns, error_threshold, history, shardview, workers
from shardops.state.breakers import (
    UNDECLARED_SOURCE_POLICY,
    breaker_policies,
    breakers_from_status,
    planner_breakers,
)

# How long a worker pod may stay Pending before the cluster counts as full: the one default of
# OperatorSettings.worker_pending_grace_seconds, and what `kubectl campaign plan` assumes.
DEFAULT_PENDING_GRACE = dt.timedelta(seconds=120)
# A campaign without a budget never reaches a warn ratio; its figures still print the API's default.
DEFAULT_WARN_RATIO: float = Budget.model_fields["warn_ratio"].default


def item_progress(
    campaign: Campaign, shards: Iterable[Shard], items_total: int, folded: FoldedShards | None = None
) -> ItemProgress:
    """How many of the campaign's `items_total` items are already cut into work shards: the largest of
    what the status records (status.cutShards), what the listed shards show and what was folded
    (`folded`, default the status's: the highest folded index + 1), so a caller that lists only the
    unfinished shards (a worker) and one whose status is a pass behind agree — and shards cut by a
    pass whose status write never came (the operator killed), then done and folded by the next,
    are never cut again."""
    size = campaign.spec.shard_size
    folded = folded if folded is not None else campaign.current_status.folded
    recorded = min(items_total, (campaign.current_status.cut_shards or 0) * size)
    listed = shardview.cut_items(shards, size, items_total)
    done = min(items_total, max((r.end for r in folded.done_ranges), default=0) * size)
    return ItemProgress(items_total, max(recorded, listed, done), size)


def campaign_facts(
    campaign: Campaign, shards: Iterable[Shard], items_total: int, folded: FoldedShards | None = None
) -> CampaignFacts:
    """What `logic.aggregate.aggregate` needs beyond the shard views (the reconcile's status step).

    `shards`: the live (unfolded) shards; `folded`: the shards folded into the ledger (default: as the
    status records them; the reconcile passes the fold it is about to write)."""
    shards = list(shards)
    spec = campaign.spec
    folded = folded if folded is not None else campaign.current_status.folded
    has_finalize = spec.finalize is not None
    return CampaignFacts(
        campaign=campaign.name,
        suspended=spec.suspend or error_threshold.held(campaign),
        items=item_progress(campaign, shards, items_total, folded),
        budget_limit=spec.budget.limit if spec.budget is not None else None,
        budget_warn_ratio=_warn_ratio(spec),
        budget_max_per_shard=_max_per_shard(spec),
        finalize_pending=has_finalize
        and shardview.finalize_name(campaign.name) not in {s.name for s in shards},
        previous_spent=campaign.current_status.spent,
        folded_done=folded.shards,
        folded_failed=folded.failed,
        folded_blocked=folded.blocked,
        folded_cost=folded.cost,
        hold=None if spec.suspend else error_threshold.hold_text(campaign),
    )


def known_items_total(campaign: Campaign, shards: Iterable[Shard]) -> int:
    """The item count as far as it is known without reading spec.itemsFrom: the inline items, else
    what the operator recorded (status.itemsTotal), else the items already cut into work shards."""
    cut = sum(s.spec.item_count for s in shards if s.spec.shard_class is ShardClass.WORK)
    inline = campaign.spec.inline_items_total
    total = inline if inline is not None else campaign.current_status.items_total
    return max(total if total is not None else cut, cut)


def campaign_budget(campaign: Campaign, views: Iterable[ShardView]) -> BudgetStatus:
    """The budget gate. Spend never goes down: a deleted or edited shard cannot un-spend money, and a
    campaign status that is not yet up to date cannot hide what the shards already report spent."""
    spec = campaign.spec
    status = campaign.current_status
    # Views are of live shards: the folded ones' cost is in status.folded.
    spent = max(status.spent, status.folded.cost + sum((v.cost for v in views), Decimal(0)))
    limit = spec.budget.limit if spec.budget is not None else None
    return budget_status(spent, limit, _warn_ratio(spec), _max_per_shard(spec))


def _warn_ratio(spec: CampaignSpec) -> float:
    return spec.budget.warn_ratio if spec.budget is not None else DEFAULT_WARN_RATIO


def _max_per_shard(spec: CampaignSpec) -> Decimal | None:
    return spec.budget.max_per_shard if spec.budget is not None else None


def breaker_states(campaign: Campaign, shards: Iterable[Shard]) -> dict[str, SourceBreaker]:
    """The breakers a new leader would start from: the status, plus the shard history it has not
    folded yet (per shard, the entries above status.historyFolded), folded in time order."""
    status = campaign.current_status
    outcomes = history.new_outcomes(shards, status.history_folded, status.history_folded_until)
    fold = history.fold_breakers(
        breakers_from_status(status),
        outcomes,
        breaker_policies(campaign.spec),
        UNDECLARED_SOURCE_POLICY,
    )
    return fold.states


def dispatch_inputs(
    campaign: Campaign,
    shards: Iterable[Shard],
    jobs: Sequence[JSON],
    pods: Sequence[JSON],
    now: dt.datetime,
    *,
    items_total: int,
    breakers: Mapping[str, SourceBreaker] | None = None,
    pending_grace: dt.timedelta = DEFAULT_PENDING_GRACE,
    refusals: Mapping[str, str] | None = None,
    queue: QueueState | None = None,
    tripped: str | None = None,
) -> DispatchInputs:
    """The planner's inputs for one cycle of `campaign`.

    `shards`: the campaign's Shards as listed; `jobs`/`pods`: its worker Jobs and their pods;
    `items_total`: the number of items (inline, or read from itemsFrom); `breakers`: the per-source
    breakers after folding (default: `breaker_states`); `pending_grace`: how long a worker pod may
    stay Pending before the cluster counts as full; `refusals`: why pod-less Jobs got no pod
    (`k8s.jobs.failed_creates` of `state.workers.podless_jobs`); `queue`: what Kueue says of the
    suspended worker Jobs (`k8s.kueue.queue_state`); `tripped`: the hold text of an error-threshold
    trip the operator's pass found and has not written yet (`error_threshold.tripped_text`).
    """
    shards = list(shards)
    spec = campaign.spec
    views = [shardview.shard_view(s) for s in shards]
    states = breakers if breakers is not None else breaker_states(campaign, shards)
    return DispatchInputs(
        limits=DispatchLimits(spec.max_concurrency, spec.backlog_ratio, spec.worker.slots_per_pod()),
        items=item_progress(campaign, shards, items_total),
        shards=views,
        breakers=planner_breakers(spec, states),
        budget=campaign_budget(campaign, views),
        suspended=spec.suspend or error_threshold.held(campaign) or tripped is not None,
        workers=workers.worker_counts(jobs, pods, now, pending_grace, refusals, queue),
        now=now,
        cooldowns=cooldowns.until_by_source(cooldowns.source_cooldowns(campaign, shards, now)),
        hold=None if spec.suspend else error_threshold.hold_text(campaign) or tripped,
        source_unresolved=_source_unresolved(campaign),
    )


def _source_unresolved(campaign: Campaign) -> str | None:
    """The SourceUnresolved condition's message while it is True and the workers need the Source to
    start (a `shardops llm` worker: state.sources.waiting_for_sources); None otherwise."""
    if campaign.spec.worker.llm is None:
        return None
    condition = campaign.current_status.condition(str(ConditionType.SOURCE_UNRESOLVED))
    if condition is None or condition.status != str(ConditionStatus.TRUE):
        return None
    return condition.message


def claim_inputs(campaign: Campaign, shards: Iterable[Shard], now: dt.datetime) -> DispatchInputs:
    """What a worker chooses its claim from: the operator's inputs (`dispatch_inputs`), breakers folded
    as a new leader would fold them, with no worker Jobs or pods (they decide how many workers to
    start, never what is claimable; a worker may not list them) and the item count a worker knows
    without reading itemsFrom (it decides when finalize may start)."""
    shards = list(shards)
    return dispatch_inputs(campaign, shards, (), (), now, items_total=known_items_total(campaign, shards))


@dataclass(frozen=True)
class ExpiredClaim:
    """A Running shard whose claim has run out: the lease sweep takes it back before planning."""

    shard: str
    action: Action
    attempt: int
    max_attempts: int
    reason: str


def expired_claims(
    campaign: Campaign, shards: Iterable[Shard], leases: Mapping[str, JSON | None], now: dt.datetime
) -> list[ExpiredClaim]:
    """Zombies among the Running shards (no heartbeat and the lease expired), with what the
    sweep does about each: Reclaim (back to Pending, attempt+1) or Block on the last attempt.

    `leases` maps a shard name to its Lease (None when it has none). A prediction on this machine's
    clock from the holders' timestamps (`shardview.one_look_silence`): the operator judges on its own
    clock from when it saw each renewal. Stalls are not predicted: they depend on how long progress
    has stood still, which only the running operator remembers.
    """
    spec = campaign.spec
    found: list[ExpiredClaim] = []
    for shard in sorted(shards, key=lambda s: s.name):
        if shardview.phase_of(shard) is not ShardPhase.RUNNING:
            continue
        # Progress timing does not matter for a zombie (the expiry is checked first).
        lease = leases.get(shard.name)
        silent = shardview.one_look_silence(shard, lease, spec.lease_seconds, now)
        observation = shardview.lease_observation(
            shard, lease, spec.lease_seconds, spec.effective_heartbeat_seconds, now, silent
        )
        verdict = classify_lease(observation, now, spec.stall.heartbeats)
        if verdict.verdict is not LeaseVerdict.ZOMBIE:
            continue
        attempt = max(shard.current_status.attempt, 1)
        action = lease_action(verdict.verdict, spec.stall.policy, attempt, spec.max_attempts)
        if action is None:  # pragma: no cover - a zombie is always reclaimed or blocked
            continue
        found.append(ExpiredClaim(shard.name, action, attempt, spec.max_attempts, verdict.reason))
    return found
