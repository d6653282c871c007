"""`kubectl campaign plan NAME`: the dry run of the scheduler's next pass, and what limits it.

The same planner (`logic.planner.plan_dispatch`) fed by the same mapping from live objects
(`state.observe.dispatch_inputs`) as the operator; it changes nothing. The view and its text are pure;
`run_plan` does the reads (Campaign, Shards, worker Jobs and Pods, the Leases of running shards, and
for itemsFrom the item ConfigMap).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from shardops.api.campaign import Campaign
from shardops.api.common import JSON
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.cli.campaign_client import EXIT_OK, bad_state
from shardops.cli.campaign_summary import budget_dict, budget_line
from shardops.cli.command import Context, load
from shardops.cli.text import NONE, iso, names_text, table
from shardops.k8s.campaigns import ItemsUnavailable
from shardops.logic.budget import BudgetStatus, reserved
from shardops.logic.planner import DispatchPlan, WorkerCounts, plan_dispatch
from shardops.logic.queues import QueueState
from shardops.state import observe, workers

# --- view (what -o json|yaml prints) ------------------------------------------------------------------


@dataclass(frozen=True)
class PlanView:
    namespace: str
    name: str
    now: dt.datetime
    plan: DispatchPlan
    expired: tuple[observe.ExpiredClaim, ...]
    running: int
    pending: int
    max_concurrency: int
    backlog_ratio: float
    workers: WorkerCounts
    budget: BudgetStatus
    items_total: int
    uncut_shards: int
    suspended: bool
    # Why the campaign is held when spec.suspend is not set (the error threshold), else None.
    hold: str | None = None
    # What the running shards may still spend under maxPerShard (0 without it).
    reserved: Decimal = Decimal(0)

    def as_dict(self) -> JSON:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "now": iso(self.now),
            "dryRun": True,
            "reason": str(self.plan.reason),
            "message": self.plan.message,
            "plan": self.plan.as_dict(),
            "expiredClaims": [
                {
                    "shard": e.shard,
                    "action": str(e.action),
                    "attempt": e.attempt,
                    "maxAttempts": e.max_attempts,
                    "reason": e.reason,
                }
                for e in self.expired
            ],
            "observed": {
                "running": self.running,
                "pending": self.pending,
                "maxConcurrency": self.max_concurrency,
                "backlogRatio": self.backlog_ratio,
                "workers": {
                    "aliveJobs": self.workers.alive_jobs,
                    "aliveSlots": self.workers.alive_slots,
                    "runningPods": self.workers.running_pods,
                    "stuckPendingPods": self.workers.stuck_pending_pods,
                },
                "budget": budget_dict(self.budget, self.reserved, self.plan.budget_hold, self.name),
                "itemsTotal": self.items_total,
                "shardsNotYetCut": self.uncut_shards,
                "suspended": self.suspended,
                "hold": self.hold,
            },
        }


def _jobs_text(jobs: tuple[int, ...]) -> str:
    """The worker Jobs to start and their slots: "2 (slots 8, 4)"."""
    if not jobs:
        return NONE
    if all(slots == 1 for slots in jobs):
        return str(len(jobs))
    return f"{len(jobs)} (slots {', '.join(map(str, jobs))})"


def plan_view(
    campaign: Campaign,
    shards: Sequence[Shard],
    jobs: Sequence[JSON],
    pods: Sequence[JSON],
    leases: Mapping[str, JSON | None],
    now: dt.datetime,
    items_total: int,
    refusals: Mapping[str, str] | None = None,
    queue: QueueState | None = None,
) -> PlanView:
    """The operator's next planning step, from the same inputs (`state.observe.dispatch_inputs`)."""
    inputs = observe.dispatch_inputs(
        campaign, shards, jobs, pods, now, items_total=items_total, refusals=refusals, queue=queue
    )
    plan = plan_dispatch(inputs)
    return PlanView(
        namespace=campaign.namespace,
        name=campaign.name,
        now=now,
        plan=plan,
        expired=tuple(observe.expired_claims(campaign, shards, leases, now)),
        running=sum(1 for v in inputs.shards if v.phase is ShardPhase.RUNNING),
        pending=sum(1 for v in inputs.shards if v.phase is ShardPhase.PENDING),
        max_concurrency=inputs.limits.max_concurrency,
        backlog_ratio=inputs.limits.backlog_ratio,
        workers=inputs.workers,
        budget=inputs.budget,
        items_total=items_total,
        uncut_shards=inputs.items.uncut_shards,
        suspended=inputs.suspended,
        hold=inputs.hold,
        reserved=reserved(
            inputs.budget.max_per_shard, (v.cost for v in inputs.shards if v.phase is ShardPhase.RUNNING)
        ),
    )


# --- text ---------------------------------------------------------------------------------------------


def render_plan(view: PlanView) -> str:
    plan = view.plan
    claimable = []
    for name in plan.claimable:
        route = plan.routes.get(name)
        if route is None:
            claimable.append(name)
        else:
            claimable.append(f"{name} → {route.source}{' (half-open probe)' if route.probe else ''}")
    expired = [
        f"{e.shard} → {e.action} (attempt {e.attempt} of {e.max_attempts}; {e.reason})" for e in view.expired
    ]
    limit = plan.limits[0].message if plan.limits else plan.message
    lines = [
        f"Plan for campaign {view.namespace}/{view.name}: dry run at {iso(view.now)}, nothing was changed.",
        f"Limited by: {plan.reason}" + (f": {limit}" if plan.limits else f" ({plan.message})"),
        "",
        "The operator's next pass would:",
        table(
            ["STEP", "WHAT"],
            [
                ["take back expired claims first", "; ".join(expired) or NONE],
                ["pause (Pending → Paused)", names_text(plan.pause)],
                ["resume (Paused → Pending)", names_text(plan.resume)],
                ["promote (Queued → Pending)", names_text(plan.promote)],
                ["cut new shards", str(plan.materialize or NONE)],
                ["hand out (claimable)", names_text(claimable)],
                ["start worker Jobs", _jobs_text(plan.start_workers)],
            ],
            "  ",
        ),
        "",
        "Observed:",
        f"  running {view.running} of maxConcurrency {view.max_concurrency}; pending {view.pending} "
        f"(backlogRatio {view.backlog_ratio:g})",
        f"  workers: {view.workers.alive_jobs} Job(s) alive ({view.workers.alive_slots} slot(s)), "
        f"{view.workers.running_pods} pod(s) running, "
        f"{view.workers.stuck_pending_pods} stuck Pending"
        + (f", {view.workers.queued_jobs} held by Kueue for quota" if view.workers.queued_jobs else ""),
        f"  items {view.items_total}, {view.uncut_shards} shard(s) not cut yet"
        + (f"; {view.hold}" if view.hold else "; spec.suspend is true" if view.suspended else ""),
        f"  budget: {budget_line(view.budget, view.reserved)}",
    ]
    if plan.budget_hold is not None:
        lines.append(f"  held by the budget: {plan.budget_hold.describe(view.budget, view.name)}")
    if plan.limits:
        lines += ["", "Every limit, in the order it must be lifted:"]
        lines.append(table(["REASON", "MESSAGE"], [[str(x.reason), x.message] for x in plan.limits], "  "))
    if plan.skipped:
        lines += ["", f"Not handed out now ({len(plan.skipped)}):"]
        lines.append(table(["SHARD", "WHY"], sorted(plan.skipped.items()), "  "))
    return "\n".join(lines)


# --- command ------------------------------------------------------------------------------------------


def items_total_for_plan(ctx: Context, campaign: Campaign) -> int:
    """What the operator counts: inline items, or the lines of the itemsFrom ConfigMap key."""
    inline = campaign.spec.inline_items_total
    if inline is not None:
        return inline
    source = campaign.spec.items_from
    if source is None:  # pragma: no cover - the model requires one of the two
        raise bad_state("the campaign has neither items nor itemsFrom")
    if source.object is not None:
        # Counting an object means reading all of it: the operator did, and recorded the count.
        counted = campaign.current_status.items_total
        if counted is None:
            raise bad_state(
                f"the operator has not counted the items of {source.describe()} yet: see the campaign's "
                "Ready condition (kubectl campaign status)"
            )
        return counted
    try:
        return ctx.client.count_items(campaign.namespace, source)
    except ItemsUnavailable as problem:
        raise bad_state(
            f"the operator would not plan campaign {campaign.name}: its items are unavailable "
            f"({problem.reason}): {problem.message}"
        ) from None


def run_plan(ctx: Context) -> int:
    _, campaign, _, shards = load(ctx, ctx.args.name)
    items_total = items_total_for_plan(ctx, campaign)
    jobs, pods = ctx.client.list_workers(campaign.namespace, campaign.name)
    leases = {
        s.name: ctx.client.get_lease(campaign.namespace, s.lease_name)
        for s in shards
        if s.phase is ShardPhase.RUNNING
    }
    now = ctx.clock()
    podless = workers.podless_jobs(jobs, pods, now, observe.DEFAULT_PENDING_GRACE)
    refusals = ctx.client.failed_creates(campaign.namespace, podless)
    queue = ctx.client.queue_state(campaign.namespace, jobs)
    view = plan_view(campaign, shards, jobs, pods, leases, now, items_total, refusals, queue)
    ctx.show(view, render_plan)
    return EXIT_OK
