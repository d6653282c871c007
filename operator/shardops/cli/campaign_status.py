"""`kubectl campaign status NAME [--watch]`: where a campaign is right now.

Counts per phase from the live Shards, the running shards, the oldest pending one, the breakers with
the state the clock gives now, the budget, the conditions and the time left. The view and its text
are pure (every function takes `now`); `run_status` and `watch_status` do the reads.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from shardops.api.campaign import Campaign
from shardops.api.common import JSON, Condition, TokenCounts
from shardops.api.enums import BreakerState, ShardPhase
from shardops.api.shard import Shard
from shardops.cli.campaign_actions import cancelled_at
from shardops.cli.campaign_client import EXIT_NO_ACCESS, EXIT_NOT_FOUND, EXIT_OK, CliError
from shardops.cli.campaign_summary import (
    budget_dict,
    budget_line,
    counts_dict,
    phase_counts,
)
from shardops.cli.command import Context, load
from shardops.cli.text import as_yaml, duration, iso, percent, relative, table
from shardops.logic.breaker import effective
from shardops.logic.budget import BudgetGate, BudgetHold, BudgetStatus, reserved
from shardops.logic.planner import plan_dispatch
from shardops.logic.transitions import EventReason
from shardops.state import breakers, error_threshold, ledger, observe
from shardops.state.summary import recorded_items_total, summarize_listed

WATCH_INTERVAL_SECONDS = 2.0
# Rate for the time-left estimate: shards finished in this window (or since the first claim).
ESTIMATE_WINDOW = dt.timedelta(minutes=15)


# --- view (what -o json|yaml prints) ------------------------------------------------------------------


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


@dataclass(frozen=True)
class StatusView:
    namespace: str
    name: str
    phase: str
    live_phase: str
    generation: int
    observed_generation: int | None
    suspended: bool
    held: str | None
    cancelled: str | None
    counts: Mapping[ShardPhase, int]
    not_cut: int
    total: int
    items_total: int | None
    items_errored: int | None
    running: tuple[RunningShard, ...]
    oldest_pending_seconds: float | None
    oldest_pending: str | None
    breakers: tuple[BreakerRow, ...]
    budget: BudgetStatus
    tokens: TokenCounts
    conditions: tuple[Condition, ...]
    estimate: Estimate
    now: dt.datetime
    # What the running shards may still spend under maxPerShard, and the work the budget holds back
    # (the planner's budget hold, as a worker would plan now); None when it holds nothing.
    reserved: Decimal = Decimal(0)
    budget_hold: BudgetHold | None = None

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
            "heldByErrorThreshold": self.held,
            "cancelled": self.cancelled,
            "counts": {
                **counts_dict(self.counts),
                "notYetCut": self.not_cut,
                "total": self.total,
            },
            "progress": {
                "done": self.done,
                "total": self.total,
                "percent": round(100 * self.done / self.total, 1) if self.total else None,
            },
            "itemsTotal": self.items_total,
            "itemsErrored": self.items_errored,
            "running": [r.as_dict() for r in self.running],
            "oldestPending": {"shard": self.oldest_pending, "seconds": self.oldest_pending_seconds},
            "breakers": [b.as_dict() for b in self.breakers],
            "budget": budget_dict(self.budget, self.reserved, self.budget_hold, self.name),
            "tokens": self.tokens.to_dict(),
            "conditions": [c.to_dict() for c in self.conditions],
            "estimate": self.estimate.as_dict(),
            "now": iso(self.now),
        }


def status_view(campaign: Campaign, shards: Sequence[Shard], now: dt.datetime) -> StatusView:
    spec = campaign.spec
    status = campaign.current_status
    live = summarize_listed(campaign, shards, now)
    agg = live.aggregate
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
    pending = [v for v in live.views if v.phase is ShardPhase.PENDING]
    oldest = min(pending, key=lambda v: (v.since, v.name)) if pending else None
    # The planner on a worker's inputs: what may start now, and whether the budget holds the rest.
    budget_hold = plan_dispatch(observe.claim_inputs(campaign, shards, now)).budget_hold
    hold = None
    held = None if spec.suspend else error_threshold.hold_text(campaign)
    if spec.suspend:
        hold = "suspended"
    elif held is not None:
        hold = "held by the error threshold"
    elif agg.budget.gate is BudgetGate.EXHAUSTED:
        hold = "the budget is exhausted"
    elif budget_hold is not None and not budget_hold.lifts_itself:
        hold = "the budget holds the work left"
    remaining = agg.total_shards - agg.counts[ShardPhase.DONE] - agg.failed_count - agg.blocked_count
    return StatusView(
        namespace=campaign.namespace,
        name=campaign.name,
        phase=str(status.phase or "New"),
        live_phase=str(agg.phase),
        generation=campaign.generation,
        observed_generation=status.observed_generation,
        suspended=spec.suspend,
        held=held,
        cancelled=cancelled_at(campaign),
        counts=live.counts,
        not_cut=live.not_cut,
        total=agg.total_shards,
        items_total=recorded_items_total(campaign),
        items_errored=campaign.current_status.items_errored,
        running=running,
        oldest_pending_seconds=(
            round(agg.oldest_pending_age.total_seconds(), 1) if agg.oldest_pending_age is not None else None
        ),
        oldest_pending=oldest.name if oldest else None,
        breakers=breaker_rows(campaign, shards, now),
        budget=agg.budget,
        tokens=ledger.campaign_tokens(status.tokens, status.folded, shards),
        conditions=tuple(status.conditions),
        estimate=estimate(shards, max(remaining, 0), now, hold),
        now=now,
        reserved=reserved(
            agg.budget.max_per_shard, (v.cost for v in live.views if v.phase is ShardPhase.RUNNING)
        ),
        budget_hold=budget_hold,
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


# --- text ---------------------------------------------------------------------------------------------


BAR_WIDTH = 30
DONE_MARK, GAVE_UP_MARK, RUNNING_MARK, LEFT_MARK = "█", "✗", "▒", "░"

LEGEND = f"{DONE_MARK} done  {GAVE_UP_MARK} failed/blocked  {RUNNING_MARK} running  {LEFT_MARK} not run yet"


def bar(done: int, gave_up: int, running: int, total: int, width: int = BAR_WIDTH) -> str:
    """A stacked bar: done, failed/blocked, running, the rest; each part rounded by largest remainder
    so the marks add up to `width` and a non-empty part never disappears."""
    if total <= 0:
        return "[" + LEFT_MARK * width + "]"
    parts = [done, gave_up, running, max(total - done - gave_up - running, 0)]
    exact = [width * p / total for p in parts]
    cells = [int(x) for x in exact]
    for i, part in enumerate(parts):
        if part and cells[i] == 0:
            cells[i] = 1
    while sum(cells) > width:
        biggest = max(range(4), key=lambda i: cells[i])
        cells[biggest] -= 1
    order = sorted(range(4), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    k = 0
    while sum(cells) < width:
        cells[order[k % 4]] += 1
        k += 1
    marks = (DONE_MARK, GAVE_UP_MARK, RUNNING_MARK, LEFT_MARK)
    return "[" + "".join(mark * n for mark, n in zip(marks, cells, strict=True)) + "]"


def render_status(view: StatusView) -> str:
    now = view.now
    counts = view.counts
    gave_up = counts[ShardPhase.FAILED] + counts[ShardPhase.BLOCKED]
    running = counts[ShardPhase.RUNNING]
    head = f"Campaign {view.namespace}/{view.name}: {view.phase}"
    notes = []
    if view.live_phase != view.phase:
        notes.append(f"shards say {view.live_phase}")
    if view.observed_generation != view.generation:
        seen = view.observed_generation if view.observed_generation is not None else "none"
        notes.append(
            f"operator has not seen the latest spec yet: generation {view.generation}, observed {seen}"
        )
    if view.cancelled:
        notes.append(f"cancelled at {view.cancelled}")
    elif view.suspended:
        notes.append("spec.suspend is true")
    elif view.held:
        notes.append(view.held)
    elif view.budget_hold is not None and not view.budget_hold.lifts_itself:
        notes.append("held by the budget: nothing more starts by itself, see Held")
    if notes:
        head += f" ({'; '.join(notes)})"
    items = f", {view.items_total} items" if view.items_total is not None else ""
    if view.items_errored:
        items += f" ({view.items_errored} errored: kubectl campaign results --failed)"
    lines = [
        head,
        f"Progress   {bar(view.done, gave_up, running, view.total)} {view.done}/{view.total} shards done "
        f"({percent(view.done, view.total)}){items}",
        f"           {LEGEND}",
        f"Shards     {phase_counts(counts, view.not_cut)}",
        f"Time left  {estimate_text(view)}",
        "Oldest pending  "
        + (
            f"{view.oldest_pending}, waiting {duration(view.oldest_pending_seconds)}"
            if view.oldest_pending
            else "none pending"
        ),
        f"Budget     {budget_line(view.budget, view.reserved)}",
    ]
    if view.budget_hold is not None:
        lines.append(f"Held       {view.budget_hold.describe(view.budget, view.name)}")
    if view.tokens.used:
        lines.append(f"Tokens     {view.tokens.describe()}")
    lines.append("")
    if view.running:
        lines.append(f"Running ({len(view.running)}):")
        running_rows: list[list[object]] = [
            [
                r.name,
                r.owner,
                f"{r.attempt}/{r.max_attempts}",
                f"{r.done}/{r.total}" if r.done is not None else None,
                relative(r.lease_until, now),
                relative(r.last_heartbeat, now),
                r.source,
            ]
            for r in view.running
        ]
        lines.append(
            table(
                ["SHARD", "OWNER", "ATTEMPT", "PROGRESS", "LEASE", "HEARTBEAT", "SOURCE"], running_rows, "  "
            )
        )
    else:
        lines.append("Running: none")
    if view.breakers:
        lines.append("")
        lines.append("Breakers:")
        breaker_rows: list[list[object]] = [
            [
                b.source,
                str(b.state),
                b.consecutive_failures,
                relative(b.opened_at, now),
                relative(b.half_open_at, now) if b.half_open_at and b.half_open_at > now else None,
                b.fallback,
                b.reason,
            ]
            for b in view.breakers
        ]
        lines.append(
            table(
                ["SOURCE", "STATE", "FAILURES", "OPENED", "HALF-OPEN", "FALLBACK", "REASON"],
                breaker_rows,
                "  ",
            )
        )
    lines.append("")
    if view.conditions:
        lines.append("Conditions:")
        condition_rows: list[list[object]] = [
            [c.type, c.status, c.reason, duration((now - c.last_transition_time).total_seconds()), c.message]
            for c in view.conditions
        ]
        lines.append(table(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], condition_rows, "  "))
    else:
        lines.append("Conditions: none yet (the operator has not written a status)")
    return "\n".join(lines)


def estimate_text(view: StatusView) -> str:
    e = view.estimate
    if e.seconds_left is None:
        return e.note
    if e.remaining == 0:
        return e.note
    rate = f"{e.per_hour:.1f} shards/h" if e.per_hour is not None else "-"
    return f"~{duration(e.seconds_left)} for {e.remaining} shard(s) at {rate} ({e.note})"


# --- command ------------------------------------------------------------------------------------------


def status_frame(ctx: Context, name: str) -> StatusView:
    _, campaign, _, shards = load(ctx, name)
    return status_view(campaign, shards, ctx.clock())


def run_status(ctx: Context) -> int:
    name = ctx.args.name
    if not ctx.args.watch:
        ctx.show(status_frame(ctx, name), render_status)
        return EXIT_OK
    return watch_status(ctx, name, ctx.args.interval)


CLEAR_SCREEN = "\x1b[H\x1b[2J"


def watch_status(
    ctx: Context, name: str, interval: float, sleep: Callable[[float], None] = time.sleep
) -> int:
    """Redraw every `interval` seconds until Ctrl-C: the screen on a terminal, one JSON document per line
    with -o json, YAML documents with -o yaml. A deleted campaign ends the watch (exit 3); a lost
    connection is reported and retried."""
    tty = ctx.output == "human" and ctx.stdout.isatty()
    drawn = False
    try:
        while True:
            try:
                view = status_frame(ctx, name)
            except CliError as error:
                if error.exit_code == EXIT_NOT_FOUND and drawn:
                    ctx.err(f"campaign {ctx.namespace}/{name} is gone (deleted while watching)")
                    return EXIT_NOT_FOUND
                if error.exit_code == EXIT_NO_ACCESS and drawn:
                    ctx.err(f"{error.message} (retrying in {interval:g}s)")
                    sleep(interval)
                    continue
                raise
            if ctx.output == "json":
                frame = json.dumps(view.as_dict(), ensure_ascii=False)
            elif ctx.output == "yaml":
                frame = "---\n" + as_yaml(view.as_dict())
            elif tty:
                frame = CLEAR_SCREEN + render_status(view) + f"\n\n(every {interval:g}s; Ctrl-C to stop)"
            else:
                frame = render_status(view) + "\n"
            ctx.out(frame)
            drawn = True
            sleep(interval)
    except KeyboardInterrupt:
        return EXIT_OK
