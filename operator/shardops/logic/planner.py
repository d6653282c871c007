"""PlanDispatch: what the operator should do this cycle, and the one reason it cannot do more.

A pure function of what the operator observed. It also backs `kubectl campaign plan` (a dry run),
so every shard it does not hand out gets a skip reason a person can read, and the workers' choice of
a claim (`state.observe.claim_inputs`): the planner is the one place that decides what may start.

The budget and the bound it gives (docs/user-guide.md, "The budget: how far over the limit can a
campaign go"):

* with `limit` and `maxPerShard`, a work shard is claimable only while
  `spent + Σ max(0, maxPerShard - cost) over running shards + max(0, maxPerShard - its cost) ≤ limit`,
  and the claimable list holds only as many as fit *together*, in claim order. Workers that look at
  once therefore contend for the same shards, and the spend the shards report stays
  `≤ limit` — plus, per shard stopped at its cap, the result lines read in the poll that passed it;
  plus the finalize shard (it is not reserved for: it may start from the warn ratio up to the limit,
  and spends at most maxPerShard); plus maxPerShard per claim decided on a view that disagreed with a
  concurrent one about which ready shard comes first (a backoff running out between two looks).
* without `maxPerShard` nothing bounds a shard's cost: work shards start while
  `spent < warnRatio * limit`, and every shard running when it is crossed finishes whatever it
  costs, so the spend is `< warnRatio * limit` + what those (at most maxConcurrency) shards spend
  from then on + the finalize shard.
* from `warnRatio * limit` only finalize shards start; at `limit` unclaimed shards are Paused.

Spend no worker reported (an attempt fenced or killed after its last heartbeat) is not in `spent`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum

from shardops.api.enums import BreakerState, ShardClass, ShardPhase
from shardops.api.money import money_text
from shardops.logic.backpressure import (
    NO_WORKER_FAILURES,
    WorkerFailures,
    backlog_bound,
    backlog_room,
    cluster_full,
    slots_to_start,
    worker_jobs,
)
from shardops.logic.breaker import CLOSED_BREAKER, Route, SourceBreaker, describe_blocked, effective, route
from shardops.logic.budget import (
    BudgetGate,
    BudgetHold,
    BudgetStatus,
    HoldCause,
    allows,
    fits,
    limit_to_start,
    reservation,
    reserved,
    room,
)
from shardops.logic.shardview import ItemProgress, ShardView
from shardops.logic.timefmt import rfc3339


class LimitReason(StrEnum):
    NONE = "None"
    CAPACITY = "Capacity"
    BACKPRESSURE = "Backpressure"
    BUDGET = "Budget"
    BREAKER = "Breaker"
    SUSPENDED = "Suspended"
    NOTHING_READY = "NothingReady"
    CLUSTER_FULL = "ClusterFull"
    WORKERS_FAILING = "WorkersFailing"
    # spec.worker.queueName names no LocalQueue: Kueue admits none of the worker Jobs.
    QUEUE_NOT_FOUND = "QueueNotFound"
    # Kueue holds a worker Job suspended until its ClusterQueue has quota for it.
    WAITING_FOR_QUOTA = "WaitingForQuota"
    # A shared Source named in spec.sources[].sourceRef does not exist or does not serve the namespace.
    SOURCE_UNRESOLVED = "SourceUnresolved"


# When several limits apply, the plan's `reason` is the first of these: the one a person would
# have to lift first for anything else to matter.
_PRECEDENCE = (
    LimitReason.SUSPENDED,
    LimitReason.BUDGET,
    LimitReason.WORKERS_FAILING,
    LimitReason.SOURCE_UNRESOLVED,
    LimitReason.QUEUE_NOT_FOUND,
    LimitReason.WAITING_FOR_QUOTA,
    LimitReason.CLUSTER_FULL,
    LimitReason.CAPACITY,
    LimitReason.BREAKER,
    LimitReason.BACKPRESSURE,
    LimitReason.NOTHING_READY,
)


@dataclass(frozen=True)
class Limit:
    reason: LimitReason
    message: str


@dataclass(frozen=True)
class DispatchLimits:
    max_concurrency: int
    backlog_ratio: float
    # spec.worker.slots: the shards one worker pod runs at once.
    slots_per_worker: int = 1

    def __post_init__(self) -> None:
        if self.max_concurrency < 0:
            raise ValueError(f"maxConcurrency must not be negative, got {self.max_concurrency}")
        if self.slots_per_worker < 1:
            raise ValueError(f"spec.worker.slots must be at least 1, got {self.slots_per_worker}")
        if self.backlog_ratio <= 0:
            raise ValueError(f"backlogRatio must be positive, got {self.backlog_ratio}")


@dataclass(frozen=True)
class WorkerCounts:
    """`alive_jobs`: worker Jobs not finished, `alive_slots` their slots (shards they may run at
    once); pods as the caller counted them (see backpressure); `recent_failures`: worker Jobs that
    failed lately (a worker may not list Jobs: none for it)."""

    alive_jobs: int
    alive_slots: int
    running_pods: int
    stuck_pending_pods: int
    recent_failures: WorkerFailures = NO_WORKER_FAILURES
    # A worker pod (or Job) that cannot start, in the kubelet's or the API server's own words
    # ("pod P: container worker: CreateContainerConfigError: secret 's3' not found"), None if none.
    cannot_start: str | None = None
    # Why one stuck Pending pod (or pod-less Job) waits, in the scheduler's or the quota's own words;
    # None when none of them says (a pod merely Pending past the grace).
    stuck_detail: str | None = None
    # Alive worker Jobs held suspended by Kueue (no pod yet: not stuck, not failing), why in its
    # words (queue_wait), and what to fix when their LocalQueue does not exist (queue_missing).
    queued_jobs: int = 0
    queue_wait: str | None = None
    queue_missing: str | None = None


@dataclass(frozen=True)
class Breakers:
    states: Mapping[str, SourceBreaker]
    fallbacks: Mapping[str, str]
    cooldown: timedelta


@dataclass(frozen=True)
class DispatchInputs:
    limits: DispatchLimits
    items: ItemProgress
    shards: Sequence[ShardView]
    breakers: Breakers
    budget: BudgetStatus
    suspended: bool
    workers: WorkerCounts
    now: datetime
    # Sources told to wait by a rate-limited answer (Retry-After), and until when: their shards are
    # not handed out before then, whichever worker would call them.
    cooldowns: Mapping[str, datetime] = field(default_factory=dict)
    # Why `suspended` holds when it is not spec.suspend (the error threshold), for the texts.
    hold: str | None = None
    # A sourceRef whose Source does not exist or does not serve the namespace, with the fix (the
    # campaign's SourceUnresolved condition), when its workers need the Source to start.
    source_unresolved: str | None = None


@dataclass(frozen=True)
class DispatchPlan:
    """`materialize`: new shards to cut from the items now, created straight in Pending (the creation is
    the MATERIALIZE transition). `promote`: existing Queued shards to move to Pending; they take the
    backlog room first, so a caller that creates new shards as Queued still stays within the bound.
    `claimable`: in claim order; `routes` gives the source each claimable shard must call (a fallback
    when its own breaker is open; `probe` marks the single HalfOpen trial).
    `skipped`: why every other unclaimed, non-terminal shard is not claimable now.
    `budget_hold`: work is left that the budget keeps from starting (None when nothing is held so).
    """

    materialize: int
    promote: tuple[str, ...]
    # The worker Jobs to start: the slots of each (spec.worker.slots; the last may have fewer).
    start_workers: tuple[int, ...]
    claimable: tuple[str, ...]
    routes: Mapping[str, Route]
    pause: tuple[str, ...]
    resume: tuple[str, ...]
    skipped: Mapping[str, str]
    limits: tuple[Limit, ...]
    reason: LimitReason
    message: str
    budget_hold: BudgetHold | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, for `kubectl campaign plan -o json`."""
        return {
            "materialize": self.materialize,
            "promote": list(self.promote),
            "startWorkers": len(self.start_workers),
            "startSlots": sum(self.start_workers),
            "claimable": list(self.claimable),
            "routes": {name: {"source": r.source, "probe": r.probe} for name, r in self.routes.items()},
            "pause": list(self.pause),
            "resume": list(self.resume),
            "skipped": dict(self.skipped),
            "limits": [{"reason": str(limit.reason), "message": limit.message} for limit in self.limits],
            "reason": str(self.reason),
            "message": self.message,
            "budgetHold": self.budget_hold.as_dict() if self.budget_hold is not None else None,
        }


@dataclass(frozen=True)
class _Skip:
    reason: LimitReason
    text: str


@dataclass(frozen=True)
class _Census:
    """`reserved`: what the running shards may still spend under maxPerShard (0 without it)."""

    running: int
    pending: tuple[ShardView, ...]
    queued: tuple[ShardView, ...]
    paused: tuple[ShardView, ...]
    running_sources: frozenset[str]
    unfinished_work: int
    running_work: int
    reserved: Decimal


@dataclass(frozen=True)
class _Growth:
    promote: tuple[str, ...]
    materialize: int
    held: Mapping[str, _Skip]
    limit: Limit | None


@dataclass
class _Selection:
    """`room`: the budget still unreserved after the shards claimable so far (None: no reservation)."""

    claimable: list[str] = field(default_factory=list)
    routes: dict[str, Route] = field(default_factory=dict)
    skipped: dict[str, _Skip] = field(default_factory=dict)
    probing: set[str] = field(default_factory=set)
    room: Decimal | None = None


@dataclass(frozen=True)
class _Draft:
    """Every decision of one cycle, before the limits and skip reasons are explained."""

    census: _Census
    growth: _Growth
    selection: _Selection
    pause: tuple[str, ...]
    resume: tuple[str, ...]
    start_workers: tuple[int, ...]
    worker_limit: Limit | None


def plan_dispatch(inputs: DispatchInputs) -> DispatchPlan:
    draft = _draft(inputs)
    skipped = _all_skips(inputs, draft)
    hold = _budget_hold(inputs, draft, skipped)
    limits = _collect_limits(inputs, draft, skipped, hold)
    selection, growth = draft.selection, draft.growth
    return DispatchPlan(
        materialize=growth.materialize,
        promote=growth.promote,
        start_workers=draft.start_workers,
        claimable=tuple(selection.claimable),
        routes=dict(selection.routes),
        pause=draft.pause,
        resume=draft.resume,
        skipped={name: skip.text for name, skip in skipped.items()},
        limits=limits,
        reason=limits[0].reason if limits else LimitReason.NONE,
        message=_message(limits, selection, growth),
        budget_hold=hold,
    )


def _draft(inputs: DispatchInputs) -> _Draft:
    census = _census(inputs)
    selection = _select_claims(inputs, census)
    ready = len(selection.claimable) + _coming(inputs, census, selection)
    start, worker_limit = _plan_workers(inputs, census, ready)
    return _Draft(
        census=census,
        growth=_plan_growth(inputs, census),
        selection=selection,
        pause=_to_pause(inputs, census),
        resume=_to_resume(inputs, census),
        start_workers=start,
        worker_limit=worker_limit,
    )


def claim_order_key(shard: ShardView) -> tuple[int, int, str]:
    """Higher priority first, then FIFO by creation index; the name only makes ties deterministic."""
    return (-shard.priority, shard.index, shard.name)


def _census(inputs: DispatchInputs) -> _Census:
    shards = inputs.shards

    def in_phase(phase: ShardPhase) -> tuple[ShardView, ...]:
        return tuple(sorted((s for s in shards if s.phase is phase), key=claim_order_key))

    running = in_phase(ShardPhase.RUNNING)
    open_work = sum(1 for s in shards if s.shard_class is ShardClass.WORK and not s.phase.terminal)
    return _Census(
        running=len(running),
        pending=in_phase(ShardPhase.PENDING),
        queued=in_phase(ShardPhase.QUEUED),
        paused=in_phase(ShardPhase.PAUSED),
        running_sources=frozenset(s.source for s in running if s.source is not None),
        unfinished_work=open_work + inputs.items.uncut_shards,
        running_work=sum(1 for s in running if s.shard_class is ShardClass.WORK),
        # Every running shard holds its reservation, a finalize one and a zombie included: a zombie
        # is reclaimed as the same shard, whose cost (and so its reservation) carries over.
        reserved=reserved(inputs.budget.max_per_shard, (s.cost for s in running)),
    )


def _holding(inputs: DispatchInputs) -> bool:
    """Suspended or out of budget: unclaimed shards wait in Paused; nothing is lost."""
    return inputs.suspended or inputs.budget.gate is BudgetGate.EXHAUSTED


def _to_pause(inputs: DispatchInputs, census: _Census) -> tuple[str, ...]:
    if not _holding(inputs):
        return ()
    return tuple(s.name for s in (*census.queued, *census.pending))


def _to_resume(inputs: DispatchInputs, census: _Census) -> tuple[str, ...]:
    if _holding(inputs):
        return ()
    return tuple(s.name for s in census.paused)


def _plan_growth(inputs: DispatchInputs, census: _Census) -> _Growth:
    """Promote Queued shards, then cut new ones, only into the room the backlog bound leaves."""
    if _holding(inputs):
        return _Growth((), 0, {}, None)
    gate = inputs.budget.gate
    eligible = [s for s in census.queued if allows(gate, s.shard_class)]
    # Paused shards go back to Pending in this same pass (`_to_resume`): they count against the bound.
    room = backlog_room(len(census.pending) + len(census.paused), inputs.limits.backlog_ratio, census.running)
    promote = tuple(s.name for s in eligible[:room])
    remaining = inputs.items.uncut_shards
    # At warn no new shards are cut: only finalize work may start.
    creatable = remaining if gate is BudgetGate.OPEN else 0
    materialize = min(room - len(promote), creatable)
    held_back = len(eligible) - len(promote) + creatable - materialize
    backlog = _describe_backlog(inputs, census)
    held = {s.name: _Skip(LimitReason.BACKPRESSURE, f"queued: {backlog}") for s in eligible[room:]}
    held.update(_budget_held_queue(inputs, census))
    limit = Limit(LimitReason.BACKPRESSURE, f"{backlog}: holding back {held_back} shard(s)")
    return _Growth(promote, materialize, held, limit if held_back > 0 else None)


def _budget_held_queue(inputs: DispatchInputs, census: _Census) -> dict[str, _Skip]:
    text = f"queued: budget at warn ({inputs.budget.describe()}): no new work shards"
    gate = inputs.budget.gate
    return {s.name: _Skip(LimitReason.BUDGET, text) for s in census.queued if not allows(gate, s.shard_class)}


def _describe_backlog(inputs: DispatchInputs, census: _Census) -> str:
    ratio = inputs.limits.backlog_ratio
    bound = backlog_bound(ratio, census.running)
    return (
        f"pending {len(census.pending)} of bound {bound} "
        f"(backlogRatio {ratio:g} * max(running {census.running}, 1))"
    )


def _select_claims(inputs: DispatchInputs, census: _Census) -> _Selection:
    selection = _Selection(
        probing=set(_probes_in_flight(inputs, census)), room=room(inputs.budget, census.reserved)
    )
    free = max(0, inputs.limits.max_concurrency - census.running)
    for shard in census.pending:
        skip = _static_skip(shard, inputs, census) or _route_or_skip(shard, inputs, selection, free)
        if skip is not None:
            selection.skipped[shard.name] = skip
        else:
            selection.claimable.append(shard.name)
    return selection


def _probes_in_flight(inputs: DispatchInputs, census: _Census) -> set[str]:
    """A HalfOpen source with a shard already running has its one probe out."""
    b = inputs.breakers
    return {
        source
        for source in census.running_sources
        if effective(b.states.get(source, CLOSED_BREAKER), inputs.now, b.cooldown) is BreakerState.HALF_OPEN
    }


def _static_skip(shard: ShardView, inputs: DispatchInputs, census: _Census) -> _Skip | None:
    """Reasons that hold whatever else is claimed this cycle, most fundamental first."""
    budget = inputs.budget
    if _holding(inputs):
        return _Skip(_hold_reason(inputs), f"pausing: {_hold_text(inputs)}")
    if not allows(budget.gate, shard.shard_class):
        return _Skip(LimitReason.BUDGET, f"budget at warn ({budget.describe()}): only finalize shards start")
    if shard.shard_class is ShardClass.FINALIZE and census.unfinished_work > 0:
        return _Skip(
            LimitReason.NOTHING_READY, f"finalize waits for {census.unfinished_work} unfinished work shard(s)"
        )
    if shard.not_before is not None and shard.not_before > inputs.now:
        wait = (shard.not_before - inputs.now).total_seconds()
        return _Skip(LimitReason.NOTHING_READY, f"backoff until {rfc3339(shard.not_before)} ({wait:.0f}s)")
    return None


def _route_or_skip(
    shard: ShardView, inputs: DispatchInputs, selection: _Selection, free: int
) -> _Skip | None:
    """Routes a ready shard and, if a slot is free, takes it (recording any probe); else says why not."""
    found = _route(shard, inputs, selection.probing)
    if shard.source is not None and found is None:
        b = inputs.breakers
        text = describe_blocked(shard.source, b.states, b.fallbacks, inputs.now, b.cooldown)
        return _Skip(LimitReason.BREAKER, text)
    cooling = inputs.cooldowns.get(found.source) if found is not None else None
    if cooling is not None and cooling > inputs.now:
        assert found is not None
        wait = (cooling - inputs.now).total_seconds()
        return _Skip(
            LimitReason.NOTHING_READY,
            f"source {found.source} cooling down until {rfc3339(cooling)} ({wait:.0f}s): it answered "
            "rate-limited with a Retry-After",
        )
    # Finalize shards keep their own rule (they may start from the warn ratio): no reservation.
    need = (
        reservation(inputs.budget.max_per_shard, shard.cost)
        if shard.shard_class is ShardClass.WORK
        else Decimal(0)
    )
    if shard.shard_class is ShardClass.WORK and not fits(need, selection.room):
        return _Skip(LimitReason.BUDGET, _no_room_text(inputs.budget, need, selection.room))
    if len(selection.claimable) >= free:
        limit = inputs.limits.max_concurrency
        return _Skip(LimitReason.CAPACITY, f"ready; waits for a free slot (maxConcurrency {limit})")
    if found is not None:
        selection.routes[shard.name] = found
        if found.probe:
            selection.probing.add(found.source)
    if selection.room is not None:
        # Claimable shards reserve together: workers looking at once contend for these, and no
        # more of them than fit.
        selection.room -= need
    return None


def _no_room_text(budget: BudgetStatus, need: Decimal, room_left: Decimal | None) -> str:
    cap = money_text(budget.max_per_shard or Decimal(0))
    unreserved = money_text(max(room_left or Decimal(0), Decimal(0)))
    return (
        f"budget: needs {money_text(need)} (maxPerShard {cap} less its cost so far), "
        f"{unreserved} of limit {money_text(budget.limit or Decimal(0))} is unreserved; "
        "waits for running shards to finish or a higher spec.budget.limit"
    )


def _route(shard: ShardView, inputs: DispatchInputs, probing: set[str]) -> Route | None:
    if shard.source is None:
        return None
    b = inputs.breakers
    return route(shard.source, b.states, b.fallbacks, inputs.now, b.cooldown, probing=probing)


def _coming(inputs: DispatchInputs, census: _Census, selection: _Selection) -> int:
    """Work shards that are claimable as soon as they are cut (uncut items, Queued shards): only the
    backlog bound keeps them back, so a worker started now is ready when they come instead of a pass
    and a worker start later — a campaign reaches its cap at the pace of its workers' start, not of
    the bound's ramp (ratio * max(running, 1)). Nothing is coming while anything else holds work
    back: suspended, out of budget or at its warn ratio, or a Pending shard waiting for something
    other than a free slot (a breaker, a cooldown, a backoff, the budget's room)."""
    if _holding(inputs) or inputs.budget.gate is not BudgetGate.OPEN:
        return 0
    if any(skip.reason is not LimitReason.CAPACITY for skip in selection.skipped.values()):
        return 0
    # Only into free slots: a slot taken by a Running shard whose worker is gone (not an alive Job)
    # is no room for another worker.
    free = max(0, inputs.limits.max_concurrency - census.running - len(selection.claimable))
    queued = sum(1 for s in census.queued if s.shard_class is ShardClass.WORK)
    return min(free, inputs.items.uncut_shards + queued)


def _plan_workers(
    inputs: DispatchInputs, census: _Census, claimable: int
) -> tuple[tuple[int, ...], Limit | None]:
    """`claimable`: shards claimable now, and those claimable once cut (`_coming`). The Jobs to
    start, by their slots."""
    w, limits = inputs.workers, inputs.limits
    if w.cannot_start is not None:
        # Said whether or not a Job is wanted: a worker that cannot start is not healthy, and a new one
        # would not start either. Lifts itself once the pod starts (the Secret created, the image fixed).
        return (), Limit(
            LimitReason.WORKERS_FAILING, f"{w.cannot_start}; no new workers until it starts: fix the cause"
        )
    # Failed Jobs against the Jobs that run the campaign at its cap (one wave of them).
    if w.recent_failures.holding(
        len(worker_jobs(limits.max_concurrency, limits.slots_per_worker)), inputs.now
    ):
        # Said even when no Job is wanted this cycle: the condition tells a person to read the logs.
        return (), Limit(LimitReason.WORKERS_FAILING, w.recent_failures.describe())
    # A Job Kueue holds says its queue has no room: another would wait behind it. Said whether or
    # not a Job is wanted now, as ClusterFull is: the campaign waits for quota either way.
    if inputs.source_unresolved is not None:
        return (), Limit(LimitReason.SOURCE_UNRESOLVED, inputs.source_unresolved)
    if w.queue_missing is not None:
        return (), Limit(LimitReason.QUEUE_NOT_FOUND, f"{w.queue_missing}; no new workers until it exists")
    if w.queued_jobs:
        return (), Limit(LimitReason.WAITING_FOR_QUOTA, f"{w.queue_wait}; no new workers until admitted")
    slots = slots_to_start(limits.max_concurrency, claimable, census.running, w.alive_slots)
    wanted = worker_jobs(slots, limits.slots_per_worker)
    # Said also when no Job is wanted now if the scheduler or the quota says why a worker waits: a
    # campaign whose only worker cannot be placed has no room, whether or not it would start another.
    if (wanted or w.stuck_detail) and cluster_full(w.stuck_pending_pods, w.running_pods):
        text = f"{w.stuck_pending_pods} worker pod(s) stuck Pending ≥ max(1, running pods {w.running_pods})"
        text += f": not starting {len(wanted)} Job(s)" if wanted else ""
        text += f"; {w.stuck_detail}" if w.stuck_detail else ""
        return (), Limit(LimitReason.CLUSTER_FULL, text)
    return wanted, None


def _all_skips(inputs: DispatchInputs, draft: _Draft) -> dict[str, _Skip]:
    """A reason for every unclaimed, non-terminal shard that is not claimable this cycle."""
    skipped: dict[str, _Skip] = dict(draft.selection.skipped)
    skipped.update(draft.growth.held)
    for name in draft.growth.promote:
        skipped[name] = _Skip(LimitReason.NONE, "materializing now: claimable once Pending")
    for name in draft.resume:
        skipped[name] = _Skip(LimitReason.NONE, "resuming now: claimable once Pending")
    if _holding(inputs):
        hold = _hold_text(inputs)
        for shard in draft.census.queued:
            skipped[shard.name] = _Skip(_hold_reason(inputs), f"pausing: {hold}")
        for shard in draft.census.paused:
            skipped[shard.name] = _Skip(_hold_reason(inputs), f"paused: {hold}")
    return skipped


def _hold_reason(inputs: DispatchInputs) -> LimitReason:
    return LimitReason.SUSPENDED if inputs.suspended else LimitReason.BUDGET


def _hold_text(inputs: DispatchInputs) -> str:
    if inputs.suspended:
        return inputs.hold or "campaign suspended"
    return f"budget exhausted ({inputs.budget.describe()})"


def _collect_limits(
    inputs: DispatchInputs, draft: _Draft, skipped: Mapping[str, _Skip], hold: BudgetHold | None
) -> tuple[Limit, ...]:
    """Every limit that held something back this cycle, in precedence order."""
    found: dict[LimitReason, Limit] = {}
    if inputs.suspended:
        found[LimitReason.SUSPENDED] = Limit(LimitReason.SUSPENDED, f"{_hold_text(inputs)}: nothing starts")
    budget_limit = _budget_limit(inputs, draft, skipped, hold)
    if budget_limit is not None:
        found[LimitReason.BUDGET] = budget_limit
    if draft.worker_limit is not None:
        found[draft.worker_limit.reason] = draft.worker_limit
    found.update(_selection_limits(inputs, draft.census, draft.selection))
    if draft.growth.limit is not None:
        found[LimitReason.BACKPRESSURE] = draft.growth.limit
    if not draft.selection.claimable and not found.keys() - {LimitReason.BACKPRESSURE}:
        found[LimitReason.NOTHING_READY] = _nothing_ready(draft.census, draft.selection)
    return tuple(found[r] for r in _PRECEDENCE if r in found)


def _budget_limit(
    inputs: DispatchInputs, draft: _Draft, skipped: Mapping[str, _Skip], hold: BudgetHold | None
) -> Limit | None:
    budget = inputs.budget
    if inputs.suspended:
        return None
    if budget.gate is BudgetGate.OPEN:
        return Limit(LimitReason.BUDGET, hold.describe(budget)) if hold is not None else None
    withheld = inputs.items.uncut_shards
    affected = any(s.reason is LimitReason.BUDGET for s in skipped.values())
    if not (affected or withheld or draft.pause):
        return None
    if budget.gate is BudgetGate.EXHAUSTED:
        return Limit(
            LimitReason.BUDGET,
            f"budget exhausted ({budget.describe()}): {len(draft.pause)} unclaimed shard(s) pause, "
            f"{draft.census.running} running finish",
        )
    return Limit(
        LimitReason.BUDGET,
        f"budget at warn ({budget.describe()}): only finalize shards start, no new shards",
    )


def _budget_hold(inputs: DispatchInputs, draft: _Draft, skipped: Mapping[str, _Skip]) -> BudgetHold | None:
    """Work is left and the budget keeps it from starting: the gate (warn, limit) or, with
    maxPerShard, no room for the next shard's reservation. A suspended campaign is held by that.
    The shards claimable this pass count as running: they hold their reservation from now on."""
    budget, census = inputs.budget, draft.census
    if inputs.suspended or budget.limit is None:
        return None
    views = {s.name: s for s in inputs.shards}
    held = sorted(
        (views[name] for name, skip in skipped.items() if skip.reason is LimitReason.BUDGET),
        key=claim_order_key,
    )
    held_work = [s for s in held if s.shard_class is ShardClass.WORK]
    # Shards not cut yet are held too once the gate is closed: none is cut from the warn ratio on.
    uncut_held = inputs.items.uncut_shards if budget.gate is not BudgetGate.OPEN else 0
    if not held_work and not uncut_held:
        return None
    cause = {
        BudgetGate.EXHAUSTED: HoldCause.LIMIT,
        BudgetGate.WARN: HoldCause.WARN_RATIO,
        BudgetGate.OPEN: HoldCause.NO_ROOM,
    }[budget.gate]
    starting = [views[name] for name in draft.selection.claimable]
    starting_work = sum(1 for s in starting if s.shard_class is ShardClass.WORK)
    holding = census.reserved + reserved(budget.max_per_shard, (s.cost for s in starting))
    # The next shard to start is the first held one in claim order, or a fresh one (cost 0).
    need = reservation(budget.max_per_shard, held_work[0].cost if held_work else Decimal(0))
    return BudgetHold(
        cause=cause,
        waiting=census.unfinished_work - census.running_work - starting_work,
        running=census.running + len(starting),
        reserved=holding,
        next_needs=need,
        raise_above=limit_to_start(budget, holding, need),
    )


def _selection_limits(
    inputs: DispatchInputs, census: _Census, selection: _Selection
) -> dict[LimitReason, Limit]:
    found: dict[LimitReason, Limit] = {}
    waiting = sum(1 for s in selection.skipped.values() if s.reason is LimitReason.CAPACITY)
    if waiting:
        found[LimitReason.CAPACITY] = Limit(
            LimitReason.CAPACITY,
            f"running {census.running} + claimable {len(selection.claimable)} fills maxConcurrency "
            f"{inputs.limits.max_concurrency}: {waiting} ready shard(s) wait",
        )
    blocked = [s.text for s in selection.skipped.values() if s.reason is LimitReason.BREAKER]
    if blocked:
        found[LimitReason.BREAKER] = Limit(
            LimitReason.BREAKER,
            f"{len(blocked)} shard(s) held by breakers ({'; '.join(sorted(set(blocked)))})",
        )
    return found


def _nothing_ready(census: _Census, selection: _Selection) -> Limit:
    waits = [s.text for s in selection.skipped.values() if s.reason is LimitReason.NOTHING_READY]
    if waits:
        text = f"no shard ready: {len(waits)} waiting (first: {waits[0]})"
    elif census.running:
        text = f"no shard pending; {census.running} running"
    else:
        text = "nothing left to dispatch"
    return Limit(LimitReason.NOTHING_READY, text)


def _message(limits: tuple[Limit, ...], selection: _Selection, growth: _Growth) -> str:
    if limits:
        return "; ".join(limit.message for limit in limits)
    return (
        f"nothing limits dispatch: {len(selection.claimable)} claimable, "
        f"{len(growth.promote) + growth.materialize} shard(s) to materialize"
    )
