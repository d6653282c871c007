"""Pure: the objects `kubectl campaign` read from the API server, turned into what it shows.

No I/O and no clock: every function takes `now`. Each view has `as_dict()` (the `-o json|yaml`
shape, camelCase, times in RFC 3339); `cli/render.py` turns views into text.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from shardops.api.campaign import Campaign
from shardops.api.common import Condition
from shardops.api.enums import BreakerState, ShardClass, ShardPhase
from shardops.api.names import SHARDOPS_FIELD_MANAGERS
from shardops.api.shard import Shard, ShardError
from shardops.logic.aggregate import aggregate
from shardops.logic.breaker import effective
from shardops.logic.budget import BudgetGate, BudgetStatus
from shardops.logic.planner import DispatchPlan, WorkerCounts, plan_dispatch
from shardops.logic.timefmt import parse_rfc3339, rfc3339
from shardops.logic.transitions import EventReason
from shardops.state import breakers, observe, shardview

JSON = dict[str, Any]

# Annotations `kubectl campaign` writes on a Campaign (see campaign_actions).
CANCELLED_ANNOTATION = "shardops.dev/cancelled"
# Rate for the time-left estimate: shards finished in this window (or since the first claim).
ESTIMATE_WINDOW = dt.timedelta(minutes=15)
# Closing checklist: "attempt distribution normal (not many shards at the maximum)". Many means more
# than this share of the shards, and at least MAX_ATTEMPTS_MIN_COUNT of them.
MAX_ATTEMPTS_SHARE = 0.2
MAX_ATTEMPTS_MIN_COUNT = 2
# Costs are floats summed in different orders by different processes.
COST_TOLERANCE = 1e-6

PHASE_ORDER = (
    ShardPhase.QUEUED,
    ShardPhase.PENDING,
    ShardPhase.RUNNING,
    ShardPhase.PAUSED,
    ShardPhase.DONE,
    ShardPhase.FAILED,
    ShardPhase.BLOCKED,
)


def iso(moment: dt.datetime | None) -> str | None:
    return rfc3339(moment) if moment is not None else None


def parse_time(text: object) -> dt.datetime | None:
    if not text or not isinstance(text, str):
        return None
    try:
        return parse_rfc3339(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def seconds_between(later: dt.datetime | None, earlier: dt.datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def parse_shards(bodies: Iterable[JSON]) -> list[Shard]:
    """Shards in index order (finalize last); one that does not parse is named in the error."""
    shards = []
    for body in bodies:
        try:
            shards.append(Shard.parse(body))
        except ValidationError as error:
            name = (body.get("metadata") or {}).get("name")
            raise ValueError(f"shard {name} does not parse: {error.errors()[0].get('msg')}") from None
    return sorted(shards, key=lambda s: (s.spec.shard_class is ShardClass.FINALIZE, s.spec.index, s.name))


def known_items_total(campaign: Campaign) -> int | None:
    """Inline items are counted from the spec; itemsFrom from the status once the operator read them."""
    inline = campaign.spec.inline_items_total
    if inline is not None:
        return inline
    return campaign.current_status.items_total


def items_total_or_cut(campaign: Campaign, shards: Sequence[Shard]) -> int:
    """The item count, or (unknown yet) the items already cut into shards, so nothing counts as left."""
    known = known_items_total(campaign)
    if known is not None:
        return known
    indices = [s.spec.index for s in shards if s.spec.shard_class is ShardClass.WORK]
    return (max(indices) + 1) * campaign.spec.shard_size if indices else 0


def cancelled_at(campaign: Campaign) -> str | None:
    return (campaign.metadata.annotations or {}).get(CANCELLED_ANNOTATION)


# --- list ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CampaignRow:
    namespace: str
    name: str
    phase: str
    done: int
    total: int
    running: int
    pending: int
    blocked: int
    failed: int
    spent: float
    budget: float | None
    suspended: bool
    cancelled: str | None
    age_seconds: float | None

    def as_dict(self) -> JSON:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "phase": self.phase,
            "progress": {"done": self.done, "total": self.total},
            "running": self.running,
            "pending": self.pending,
            "blocked": self.blocked,
            "failed": self.failed,
            "spent": self.spent,
            "budget": self.budget,
            "suspended": self.suspended,
            "cancelled": self.cancelled,
            "ageSeconds": self.age_seconds,
        }


def campaign_rows(bodies: Iterable[JSON], now: dt.datetime) -> list[CampaignRow]:
    """From the objects as listed (no shard reads): what the operator last wrote in each status."""
    rows = []
    for body in bodies:
        metadata = body.get("metadata") or {}
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        counts = status.get("counts") or {}
        total = status.get("shardsTotal")
        created = parse_time(metadata.get("creationTimestamp"))
        rows.append(
            CampaignRow(
                namespace=str(metadata.get("namespace") or ""),
                name=str(metadata.get("name") or ""),
                phase=str(status.get("phase") or "New"),
                done=int(counts.get("done") or 0),
                total=int(total if total is not None else counts.get("total") or 0),
                running=int(counts.get("running") or 0),
                pending=int(counts.get("pending") or 0),
                blocked=int(counts.get("blocked") or 0),
                failed=int(counts.get("failed") or 0),
                spent=float(status.get("spent") or 0.0),
                budget=float(spec["budget"]["limit"]) if (spec.get("budget") or {}).get("limit") else None,
                suspended=bool(spec.get("suspend")),
                cancelled=(metadata.get("annotations") or {}).get(CANCELLED_ANNOTATION),
                age_seconds=seconds_between(now, created),
            )
        )
    return sorted(rows, key=lambda r: (r.namespace, r.name))


# --- status ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningShard:
    name: str
    owner: str | None
    attempt: int
    max_attempts: int
    done: int | None
    total: int | None
    lease_until: dt.datetime | None
    last_heartbeat: dt.datetime | None
    source: str | None

    def as_dict(self) -> JSON:
        return {
            "name": self.name,
            "owner": self.owner,
            "attempt": self.attempt,
            "maxAttempts": self.max_attempts,
            "progress": None if self.done is None else {"done": self.done, "total": self.total},
            "leaseUntil": iso(self.lease_until),
            "lastHeartbeat": iso(self.last_heartbeat),
            "source": self.source,
        }


@dataclass(frozen=True)
class BreakerRow:
    source: str
    state: BreakerState
    consecutive_failures: int
    opened_at: dt.datetime | None
    half_open_at: dt.datetime | None
    reason: str | None
    fallback: str | None

    def as_dict(self) -> JSON:
        return {
            "source": self.source,
            "state": str(self.state),
            "consecutiveFailures": self.consecutive_failures,
            "openedAt": iso(self.opened_at),
            "halfOpenAt": iso(self.half_open_at),
            "reason": self.reason,
            "fallback": self.fallback,
        }


@dataclass(frozen=True)
class Estimate:
    """`seconds_left` is None when no rate can be given; `note` says why, or what the rate is based on."""

    remaining: int
    finished_in_window: int
    window_seconds: float
    per_hour: float | None
    seconds_left: float | None
    note: str

    def as_dict(self) -> JSON:
        return {
            "remainingShards": self.remaining,
            "finishedInWindow": self.finished_in_window,
            "windowSeconds": round(self.window_seconds, 1),
            "shardsPerHour": None if self.per_hour is None else round(self.per_hour, 2),
            "secondsLeft": None if self.seconds_left is None else round(self.seconds_left),
            "note": self.note,
        }


def finished_at(shard: Shard) -> dt.datetime | None:
    """When a Done shard became Done, from its history."""
    if shard.phase is not ShardPhase.DONE:
        return None
    for entry in reversed(shard.current_status.history):
        if entry.phase is ShardPhase.DONE:
            return entry.at
    return None


def first_claim(shards: Iterable[Shard]) -> dt.datetime | None:
    claims = [
        entry.at
        for shard in shards
        for entry in shard.current_status.history
        if entry.reason == str(EventReason.CLAIMED)
    ]
    return min(claims) if claims else None


def estimate(shards: Sequence[Shard], remaining: int, now: dt.datetime, hold: str | None) -> Estimate:
    """Time left = remaining shards / the rate at which shards reached Done over the last
    ESTIMATE_WINDOW (or since the first claim, when the campaign is younger than that)."""
    start = first_claim(shards)
    window_start = now - ESTIMATE_WINDOW
    if start is not None and start > window_start:
        window_start = start
    window = max((now - window_start).total_seconds(), 0.0)
    finished = sum(1 for s in shards if (t := finished_at(s)) is not None and window_start <= t <= now)
    per_hour = finished / window * 3600 if window > 0 and finished else None
    if remaining == 0:
        return Estimate(0, finished, window, per_hour, 0.0, "nothing left to run")
    if hold is not None:
        return Estimate(remaining, finished, window, per_hour, None, f"no estimate while {hold}")
    if start is None:
        return Estimate(remaining, 0, 0.0, None, None, "no estimate yet: no shard has been claimed")
    if per_hour is None:
        span = duration(window)
        return Estimate(
            remaining, 0, window, None, None, f"no estimate: no shard finished in the last {span}"
        )
    seconds = remaining / per_hour * 3600
    basis = f"{finished} shard(s) finished in the last {duration(window)}"
    return Estimate(remaining, finished, window, per_hour, seconds, basis)


def duration(seconds: float | None) -> str:
    """45s, 3m12s, 2h05m, 3d04h: two units at most, like kubectl's ages; "-" for None."""
    if seconds is None:
        return "-"
    total = max(0, round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, sec = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


@dataclass(frozen=True)
class StatusView:
    namespace: str
    name: str
    phase: str
    live_phase: str
    generation: int
    observed_generation: int | None
    suspended: bool
    cancelled: str | None
    counts: Mapping[ShardPhase, int]
    not_cut: int
    total: int
    items_total: int | None
    running: tuple[RunningShard, ...]
    oldest_pending_seconds: float | None
    oldest_pending: str | None
    breakers: tuple[BreakerRow, ...]
    budget: BudgetStatus
    conditions: tuple[Condition, ...]
    estimate: Estimate
    now: dt.datetime

    @property
    def done(self) -> int:
        return self.counts[ShardPhase.DONE]

    def as_dict(self) -> JSON:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "phase": self.phase,
            "livePhase": self.live_phase,
            "generation": self.generation,
            "observedGeneration": self.observed_generation,
            "suspended": self.suspended,
            "cancelled": self.cancelled,
            "counts": {
                **{str(p).lower(): self.counts[p] for p in PHASE_ORDER},
                "notYetCut": self.not_cut,
                "total": self.total,
            },
            "progress": {
                "done": self.done,
                "total": self.total,
                "percent": round(100 * self.done / self.total, 1) if self.total else None,
            },
            "itemsTotal": self.items_total,
            "running": [r.as_dict() for r in self.running],
            "oldestPending": {"shard": self.oldest_pending, "seconds": self.oldest_pending_seconds},
            "breakers": [b.as_dict() for b in self.breakers],
            "budget": budget_dict(self.budget),
            "conditions": [c.to_dict() for c in self.conditions],
            "estimate": self.estimate.as_dict(),
            "now": iso(self.now),
        }


def budget_dict(budget: BudgetStatus) -> JSON:
    return {
        "spent": budget.spent,
        "limit": budget.limit,
        "ratio": (budget.spent / budget.limit) if budget.limit else None,
        "warnRatio": budget.warn_ratio if budget.limit is not None else None,
        "gate": str(budget.gate),
    }


def status_view(campaign: Campaign, shards: Sequence[Shard], now: dt.datetime) -> StatusView:
    spec = campaign.spec
    status = campaign.current_status
    views = [shardview.shard_view(s) for s in shards]
    facts = observe.campaign_facts(campaign, shards, items_total_or_cut(campaign, shards))
    agg = aggregate(views, now, facts)
    not_cut = facts.shards_not_cut
    counts = dict(agg.counts)
    running = tuple(
        RunningShard(
            name=s.name,
            owner=s.current_status.owner,
            attempt=max(s.current_status.attempt, 1),
            max_attempts=spec.max_attempts,
            done=s.current_status.progress.done if s.current_status.progress else None,
            total=s.current_status.progress.total if s.current_status.progress else None,
            lease_until=s.current_status.lease_until,
            last_heartbeat=s.current_status.last_heartbeat,
            source=s.current_status.source or s.spec.source,
        )
        for s in shards
        if s.phase is ShardPhase.RUNNING
    )
    pending = [v for v in views if v.phase is ShardPhase.PENDING]
    oldest = min(pending, key=lambda v: (v.since, v.name)) if pending else None
    hold = None
    if spec.suspend:
        hold = "suspended"
    elif agg.budget.gate is BudgetGate.EXHAUSTED:
        hold = "the budget is exhausted"
    remaining = agg.total_shards - agg.counts[ShardPhase.DONE] - agg.failed_count - agg.blocked_count
    return StatusView(
        namespace=campaign.namespace,
        name=campaign.name,
        phase=str(status.phase or "New"),
        live_phase=str(agg.phase),
        generation=campaign.generation,
        observed_generation=status.observed_generation,
        suspended=spec.suspend,
        cancelled=cancelled_at(campaign),
        counts=counts,
        not_cut=not_cut,
        total=agg.total_shards,
        items_total=known_items_total(campaign),
        running=running,
        oldest_pending_seconds=(
            round(agg.oldest_pending_age.total_seconds(), 1) if agg.oldest_pending_age is not None else None
        ),
        oldest_pending=oldest.name if oldest else None,
        breakers=breaker_rows(campaign, shards, now),
        budget=agg.budget,
        conditions=tuple(status.conditions),
        estimate=estimate(shards, max(remaining, 0), now, hold),
        now=now,
    )


def breaker_rows(campaign: Campaign, shards: Sequence[Shard], now: dt.datetime) -> tuple[BreakerRow, ...]:
    """Every declared source and any other that tripped, with the state the clock gives now (the
    status may say Open for a breaker whose cooldown has passed: that one is HalfOpen)."""
    spec = campaign.spec
    states = observe.breaker_states(campaign, shards)
    reasons = {b.source: b.reason for b in campaign.current_status.breakers}
    names = list(spec.source_names) + sorted(s for s in states if s not in spec.source_names)
    rows = []
    for name in names:
        breaker = states.get(name)
        cooldown = breakers.cooldown_of(spec, name)
        state = effective(breaker, now, cooldown) if breaker is not None else BreakerState.CLOSED
        opened = breaker.opened_at if breaker is not None and state is not BreakerState.CLOSED else None
        declared = spec.source(name)
        rows.append(
            BreakerRow(
                source=name,
                state=state,
                consecutive_failures=breaker.consecutive_rate_limited if breaker is not None else 0,
                opened_at=opened,
                half_open_at=opened + cooldown if opened is not None else None,
                reason=reasons.get(name) if state is not BreakerState.CLOSED else None,
                fallback=declared.fallback if declared is not None else None,
            )
        )
    return tuple(rows)


# --- plan ----------------------------------------------------------------------------------------------


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
    remaining_shards: int
    suspended: bool

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
                    "runningPods": self.workers.running_pods,
                    "stuckPendingPods": self.workers.stuck_pending_pods,
                },
                "budget": budget_dict(self.budget),
                "itemsTotal": self.items_total,
                "shardsNotYetCut": self.remaining_shards,
                "suspended": self.suspended,
            },
        }


def plan_view(
    campaign: Campaign,
    shards: Sequence[Shard],
    jobs: Sequence[JSON],
    pods: Sequence[JSON],
    leases: Mapping[str, JSON | None],
    now: dt.datetime,
    items_total: int,
) -> PlanView:
    """The operator's next planning step, from the same inputs (`operator.observe.dispatch_inputs`)."""
    inputs = observe.dispatch_inputs(campaign, shards, jobs, pods, now, items_total=items_total)
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
        remaining_shards=inputs.items.remaining_shards,
        suspended=inputs.suspended,
    )


# --- events (timeline) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineRow:
    """One step of a shard's life. `origin`: history (status.history), event (a Kubernetes Event),
    history+event (both, joined by the event name), status (the latest heartbeat)."""

    at: dt.datetime
    reason: str
    phase: str | None
    attempt: int | None
    owner: str | None
    lease_until: dt.datetime | None
    event: str | None
    type: str | None
    note: str | None
    origin: str
    source: str | None = None
    error_class: str | None = None

    def as_dict(self) -> JSON:
        return {
            "time": iso(self.at),
            "reason": self.reason,
            "phase": self.phase,
            "attempt": self.attempt,
            "owner": self.owner,
            "leaseUntil": iso(self.lease_until),
            "event": self.event,
            "type": self.type,
            "note": self.note,
            "origin": self.origin,
            "source": self.source,
            "errorClass": self.error_class,
        }


@dataclass(frozen=True)
class TimelineView:
    namespace: str
    shard: str
    campaign: str
    phase: str
    attempt: int
    max_attempts: int | None
    owner: str | None
    lease_until: dt.datetime | None
    last_heartbeat: dt.datetime | None
    progress: tuple[int, int] | None
    last_error: ShardError | None
    rows: tuple[TimelineRow, ...]
    now: dt.datetime
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> JSON:
        error = self.last_error
        return {
            "namespace": self.namespace,
            "shard": self.shard,
            "campaign": self.campaign,
            "phase": self.phase,
            "attempt": self.attempt,
            "maxAttempts": self.max_attempts,
            "owner": self.owner,
            "leaseUntil": iso(self.lease_until),
            "lastHeartbeat": iso(self.last_heartbeat),
            "progress": None
            if self.progress is None
            else {"done": self.progress[0], "total": self.progress[1]},
            "lastError": None if error is None else error.to_dict(),
            "timeline": [r.as_dict() for r in self.rows],
            "warnings": list(self.warnings),
            "now": iso(self.now),
        }


def event_time(event: JSON) -> dt.datetime | None:
    series = event.get("series") or {}
    return (
        parse_time(series.get("lastObservedTime"))
        or parse_time(event.get("eventTime"))
        or parse_time(event.get("deprecatedLastTimestamp"))
        or parse_time((event.get("metadata") or {}).get("creationTimestamp"))
    )


def timeline_view(
    shard: Shard,
    events: Iterable[JSON],
    now: dt.datetime,
    *,
    lease_seconds: int | None = None,
    max_attempts: int | None = None,
    warnings: Sequence[str] = (),
) -> TimelineView:
    """The shard's history merged with its Events by time. A history entry and the Event it names are
    one row. Events of an earlier object of the same name (another uid) are left out.
    `lease_seconds` (from the campaign) gives each claim's first lease expiry."""
    status = shard.current_status
    uid = shard.metadata.uid
    by_name: dict[str, JSON] = {}
    for event in events:
        regarding = event.get("regarding") or {}
        if regarding.get("kind") not in (None, "Shard"):
            continue
        if uid and regarding.get("uid") and regarding.get("uid") != uid:
            continue
        name = (event.get("metadata") or {}).get("name")
        if name:
            by_name[str(name)] = event
    rows: list[TimelineRow] = []
    used: set[str] = set()
    for entry in status.history:
        matched = by_name.get(entry.event or "")
        if matched is not None:
            used.add(str(entry.event))
        claimed = entry.reason == str(EventReason.CLAIMED)
        lease_until = entry.at + dt.timedelta(seconds=lease_seconds) if claimed and lease_seconds else None
        rows.append(
            TimelineRow(
                at=entry.at,
                reason=entry.reason,
                phase=str(entry.phase),
                attempt=entry.attempt,
                owner=entry.owner,
                lease_until=lease_until,
                event=entry.event,
                type=str(matched.get("type")) if matched is not None and matched.get("type") else None,
                note=str(matched.get("note")) if matched is not None and matched.get("note") else None,
                origin="history+event" if matched is not None else "history",
                source=entry.source,
                error_class=str(entry.error_class) if entry.error_class is not None else None,
            )
        )
    for name, other in by_name.items():
        if name in used:
            continue
        at = event_time(other)
        if at is None:
            continue
        rows.append(
            TimelineRow(
                at=at,
                reason=str(other.get("reason") or ""),
                phase=None,
                attempt=None,
                owner=None,
                lease_until=None,
                event=name,
                type=str(other.get("type")) if other.get("type") else None,
                note=str(other.get("note")) if other.get("note") else None,
                origin="event",
            )
        )
    if status.last_heartbeat is not None:
        beat = status.last_heartbeat
        # The attempt the heartbeat belongs to: the last claim before it (status.attempt may already
        # count the next attempt of a shard that failed since).
        claims = [e for e in status.history if e.reason == str(EventReason.CLAIMED) and e.at <= beat]
        beat_attempt = claims[-1].attempt if claims else status.attempt
        progress = status.progress
        note = (
            f"progress {progress.done}/{progress.total}" if progress is not None else "no progress reported"
        )
        rows.append(
            TimelineRow(
                at=status.last_heartbeat,
                reason="Heartbeat",
                phase=None,
                attempt=beat_attempt,
                owner=status.owner,
                lease_until=status.lease_until if shard.phase is ShardPhase.RUNNING else None,
                event=None,
                type=None,
                note=f"latest heartbeat (earlier ones are not recorded): {note}",
                origin="status",
            )
        )
    order = {id(row): n for n, row in enumerate(rows)}
    rows.sort(key=lambda r: (r.at, order[id(r)]))
    progress_pair = (status.progress.done, status.progress.total) if status.progress is not None else None
    return TimelineView(
        namespace=shard.namespace,
        shard=shard.name,
        campaign=shard.campaign_name,
        phase=str(shard.phase or ShardPhase.QUEUED),
        attempt=status.attempt,
        max_attempts=max_attempts,
        owner=status.owner,
        lease_until=status.lease_until,
        last_heartbeat=status.last_heartbeat,
        progress=progress_pair,
        last_error=status.last_error,
        rows=tuple(rows),
        now=now,
        warnings=tuple(warnings),
    )


# --- report --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One line of seed 000's closing checklist."""

    key: str
    title: str
    passed: bool
    detail: str
    offenders: tuple[str, ...] = ()

    def as_dict(self) -> JSON:
        return {
            "check": self.key,
            "title": self.title,
            "passed": self.passed,
            "detail": self.detail,
            "offenders": list(self.offenders),
        }


@dataclass(frozen=True)
class GaveUp:
    name: str
    phase: str
    attempt: int
    error_class: str | None
    message: str | None
    event: str | None

    def as_dict(self) -> JSON:
        return {
            "name": self.name,
            "phase": self.phase,
            "attempt": self.attempt,
            "errorClass": self.error_class,
            "message": self.message,
            "event": self.event,
        }


@dataclass(frozen=True)
class ReportView:
    namespace: str
    name: str
    phase: str
    counts: Mapping[ShardPhase, int]
    not_cut: int
    total: int
    items_done: int
    items_total: int | None
    budget: BudgetStatus
    shard_costs: float
    status_spent: float
    gave_up: tuple[GaveUp, ...]
    left: tuple[str, ...]
    checks: tuple[Check, ...]
    now: dt.datetime

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def done(self) -> int:
        return self.counts[ShardPhase.DONE]

    def as_dict(self) -> JSON:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "phase": self.phase,
            "where": {
                "counts": {str(p).lower(): self.counts[p] for p in PHASE_ORDER},
                "notYetCut": self.not_cut,
                "doneShards": self.done,
                "totalShards": self.total,
                "itemsDone": self.items_done,
                "itemsTotal": self.items_total,
            },
            "spent": {
                **budget_dict(self.budget),
                "statusSpent": self.status_spent,
                "shardCosts": self.shard_costs,
            },
            "left": {"summary": list(self.left), "gaveUp": [g.as_dict() for g in self.gave_up]},
            "checklist": [c.as_dict() for c in self.checks],
            "passed": self.passed,
            "now": iso(self.now),
        }


def report_view(campaign: Campaign, shard_bodies: Sequence[JSON], now: dt.datetime) -> ReportView:
    shards = parse_shards(shard_bodies)
    spec = campaign.spec
    status = campaign.current_status
    views = [shardview.shard_view(s) for s in shards]
    facts = observe.campaign_facts(campaign, shards, items_total_or_cut(campaign, shards))
    agg = aggregate(views, now, facts)
    counts = dict(agg.counts)
    not_cut = facts.shards_not_cut
    gave_up = tuple(
        GaveUp(
            name=s.name,
            phase=str(s.phase),
            attempt=s.current_status.attempt,
            error_class=str(s.current_status.last_error.error_class) if s.current_status.last_error else None,
            message=s.current_status.last_error.message if s.current_status.last_error else None,
            event=_failure_event(s),
        )
        for s in shards
        if s.phase in (ShardPhase.FAILED, ShardPhase.BLOCKED)
    )
    shard_costs = math.fsum(s.current_status.cost for s in shards)
    checks = (
        check_fingerprints(shards),
        check_failure_records(shards),
        check_attempts(shards, spec.max_attempts),
        check_spend(status.spent, shard_costs, campaign.status is not None),
        check_managers(shard_bodies),
    )
    items_done = sum(
        s.spec.item_count for s in shards if s.phase is ShardPhase.DONE and not s.spec.is_finalize
    )
    return ReportView(
        namespace=campaign.namespace,
        name=campaign.name,
        phase=str(status.phase or "New"),
        counts=counts,
        not_cut=not_cut,
        total=agg.total_shards,
        items_done=items_done,
        items_total=known_items_total(campaign),
        budget=agg.budget,
        shard_costs=shard_costs,
        status_spent=status.spent,
        gave_up=gave_up,
        left=what_is_left(campaign, counts, not_cut, agg.budget),
        checks=checks,
        now=now,
    )


def _failure_event(shard: Shard) -> str | None:
    error = shard.current_status.last_error
    if error is not None and error.event:
        return error.event
    history = shard.current_status.history
    if history and history[-1].phase == shard.phase and history[-1].event:
        return history[-1].event
    return None


def what_is_left(
    campaign: Campaign, counts: Mapping[ShardPhase, int], not_cut: int, budget: BudgetStatus
) -> tuple[str, ...]:
    """Plain sentences: what still has to happen, and the action that makes it happen."""
    name = campaign.name
    lines: list[str] = []
    unfinished = sum(counts[p] for p in (ShardPhase.QUEUED, ShardPhase.PENDING, ShardPhase.RUNNING)) + not_cut
    if unfinished:
        lines.append(
            f"{unfinished} shard(s) not finished: {counts[ShardPhase.RUNNING]} running, "
            f"{counts[ShardPhase.PENDING]} pending, {counts[ShardPhase.QUEUED] + not_cut} not yet started"
        )
    paused = counts[ShardPhase.PAUSED]
    if paused:
        if campaign.spec.suspend:
            why = f"suspended: kubectl campaign resume {name}"
        elif budget.gate is BudgetGate.EXHAUSTED:
            why = f"budget exhausted ({budget.describe()}): raise spec.budget.limit to continue"
        else:
            why = "resuming on the operator's next pass"
        lines.append(f"{paused} shard(s) paused ({why})")
    gave_up = counts[ShardPhase.FAILED] + counts[ShardPhase.BLOCKED]
    if gave_up:
        lines.append(
            f"{counts[ShardPhase.BLOCKED]} blocked and {counts[ShardPhase.FAILED]} failed shard(s) are "
            f"not done: fix the cause, then kubectl campaign retry {name} (recorded; attempts reset)"
        )
    if budget.limit is not None:
        left = max(budget.limit - budget.spent, 0.0)
        lines.append(f"budget left: {left:g} of {budget.limit:g}")
    if not lines:
        lines.append("nothing: every shard is done")
    return tuple(lines)


def check_fingerprints(shards: Sequence[Shard]) -> Check:
    done = [s for s in shards if s.phase is ShardPhase.DONE]
    missing = tuple(
        s.name for s in done if s.current_status.result is None or not s.current_status.result.fingerprint
    )
    title = "every Done shard has a result fingerprint"
    if missing:
        return Check(
            "result-fingerprints", title, False, f"{len(missing)} of {len(done)} without one", missing
        )
    return Check("result-fingerprints", title, True, f"{len(done)} of {len(done)} have one")


def check_failure_records(shards: Sequence[Shard]) -> Check:
    title = "every Failed/Blocked shard has a reason and an event name"
    gave_up = [s for s in shards if s.phase in (ShardPhase.FAILED, ShardPhase.BLOCKED)]
    problems = []
    for shard in gave_up:
        error = shard.current_status.last_error
        lacking = []
        if error is None or not error.message:
            lacking.append("reason")
        if _failure_event(shard) is None:
            lacking.append("event name")
        if lacking:
            problems.append(f"{shard.name} ({shard.phase}): no {' and no '.join(lacking)}")
    if problems:
        return Check(
            "failure-records", title, False, f"{len(problems)} of {len(gave_up)} incomplete", tuple(problems)
        )
    return Check("failure-records", title, True, f"{len(gave_up)} of {len(gave_up)} complete")


def check_attempts(shards: Sequence[Shard], max_attempts: int) -> Check:
    title = f"attempt distribution normal (not many shards at maxAttempts {max_attempts})"
    started = [s for s in shards if s.current_status.attempt > 0]
    spread = Counter(s.current_status.attempt for s in started)
    shape = ", ".join(f"attempt {a}: {n}" for a, n in sorted(spread.items())) or "no attempts yet"
    at_max = tuple(s.name for s in started if s.current_status.attempt >= max_attempts)
    many = len(at_max) >= MAX_ATTEMPTS_MIN_COUNT and len(at_max) > MAX_ATTEMPTS_SHARE * len(started)
    detail = (
        f"{shape}; {len(at_max)} of {len(started)} at maxAttempts (flagged above {MAX_ATTEMPTS_SHARE:.0%})"
    )
    return Check("attempt-distribution", title, not many, detail, at_max if many else ())


def check_spend(status_spent: float, shard_costs: float, has_status: bool) -> Check:
    title = "budget spent matches the sum of shard costs"
    if not has_status:
        return Check("spend-matches", title, False, "the operator has not written a status yet")
    ok = math.isclose(status_spent, shard_costs, rel_tol=1e-9, abs_tol=COST_TOLERANCE)
    detail = f"status.spent {status_spent:g}, shard costs add up to {shard_costs:g}"
    if not ok and status_spent > shard_costs:
        detail += " (spend recorded for shards that are gone or were edited)"
    return Check("spend-matches", title, ok, detail)


def status_managers(body: JSON) -> list[tuple[str, str | None]]:
    """(manager, time) of every managedFields entry that wrote the status subresource."""
    found = []
    for entry in (body.get("metadata") or {}).get("managedFields") or []:
        if entry.get("subresource") == "status":
            found.append((str(entry.get("manager") or "<none>"), entry.get("time")))
    return found


def check_managers(shard_bodies: Sequence[JSON]) -> Check:
    title = "no sign of a manual state change (shard status written by shardops only)"
    offenders = []
    for body in shard_bodies:
        name = (body.get("metadata") or {}).get("name")
        for manager, at in status_managers(body):
            if manager not in SHARDOPS_FIELD_MANAGERS:
                offenders.append(f"{name}: status written by {manager}" + (f" at {at}" if at else ""))
    allowed = ", ".join(sorted(SHARDOPS_FIELD_MANAGERS))
    if offenders:
        return Check(
            "no-manual-changes",
            title,
            False,
            f"{len(offenders)} status write(s) by other managers (allowed: {allowed})",
            tuple(offenders),
        )
    return Check("no-manual-changes", title, True, f"every status field manager is one of {allowed}")
