"""Pure renderers: a `kubectl campaign` view in, human text out. No I/O, no clock (views carry `now`)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from shardops.api.enums import ShardPhase
from shardops.cli.campaign_actions import ActionResult
from shardops.cli.campaign_views import (
    PHASE_ORDER,
    CampaignRow,
    PlanView,
    ReportView,
    StatusView,
    TimelineView,
    duration,
    iso,
)
from shardops.logic.budget import BudgetStatus

BAR_WIDTH = 30
DONE_MARK, GAVE_UP_MARK, RUNNING_MARK, LEFT_MARK = "█", "✗", "▒", "░"
NONE = "-"
LEGEND = f"{DONE_MARK} done  {GAVE_UP_MARK} failed/blocked  {RUNNING_MARK} running  {LEFT_MARK} not run yet"


# --- building blocks ------------------------------------------------------------------------------------


def relative(moment: dt.datetime | None, now: dt.datetime) -> str:
    """ "in 40s" for the future, "12s ago" for the past."""
    if moment is None:
        return NONE
    delta = (moment - now).total_seconds()
    if delta >= 0:
        return f"in {duration(delta)}"
    return f"{duration(-delta)} ago"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """Columns padded like `kubectl get`; the last column is not padded (free text)."""
    cells = [[str(h) for h in headers]] + [
        [NONE if c is None or c == "" else str(c) for c in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append((indent + "   ".join(padded)).rstrip())
    return "\n".join(lines)


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


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def phase_counts(counts: Mapping[ShardPhase, int], not_cut: int) -> str:
    parts = []
    for phase in PHASE_ORDER:
        text = f"{str(phase).lower()} {counts[phase]}"
        if phase is ShardPhase.QUEUED and not_cut:
            text = f"queued {counts[phase] + not_cut} ({not_cut} not yet cut)"
        parts.append(text)
    return " · ".join(parts)


def budget_line(budget: BudgetStatus) -> str:
    if budget.limit is None:
        return f"spent {budget.spent:g}, no budget limit"
    return (
        f"spent {budget.spent:g} of {budget.limit:g} ({percent(budget.spent, budget.limit)}), "
        f"warn at {budget.warn_ratio:.0%}: gate {budget.gate}"
    )


def as_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def as_yaml(data: Any) -> str:
    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True)).rstrip("\n")


# --- list -------------------------------------------------------------------------------------------


def render_list(rows: Sequence[CampaignRow], *, all_namespaces: bool) -> str:
    headers = ["NAME", "PHASE", "PROGRESS", "RUNNING", "PENDING", "BLOCKED", "FAILED", "SPENT/BUDGET", "AGE"]
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
    lines = []
    for r in rows:
        phase = r.phase
        if r.cancelled:
            phase += " (cancelled)"
        elif r.suspended and r.phase != "Suspended":
            phase += " (suspend requested)"
        spent = f"{r.spent:g}/{r.budget:g} ({percent(r.spent, r.budget)})" if r.budget else f"{r.spent:g}/-"
        row: list[object] = [
            r.name,
            phase,
            f"{r.done}/{r.total} ({percent(r.done, r.total)})",
            r.running,
            r.pending,
            r.blocked,
            r.failed,
            spent,
            duration(r.age_seconds),
        ]
        if all_namespaces:
            row.insert(0, r.namespace)
        lines.append(row)
    return table(headers, lines)


# --- status ------------------------------------------------------------------------------------------


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
    if notes:
        head += f" ({'; '.join(notes)})"
    items = f", {view.items_total} items" if view.items_total is not None else ""
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
        f"Budget     {budget_line(view.budget)}",
    ]
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


# --- plan ------------------------------------------------------------------------------------------------


def names_text(names: Sequence[str], limit: int = 8) -> str:
    if not names:
        return NONE
    shown = ", ".join(names[:limit])
    return shown + (f", +{len(names) - limit} more" if len(names) > limit else "")


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
                ["start worker Jobs", str(plan.start_workers or NONE)],
            ],
            "  ",
        ),
        "",
        "Observed:",
        f"  running {view.running} of maxConcurrency {view.max_concurrency}; pending {view.pending} "
        f"(backlogRatio {view.backlog_ratio:g})",
        f"  workers: {view.workers.alive_jobs} Job(s) alive, {view.workers.running_pods} pod(s) running, "
        f"{view.workers.stuck_pending_pods} stuck Pending",
        f"  items {view.items_total}, {view.remaining_shards} shard(s) not cut yet"
        + ("; spec.suspend is true" if view.suspended else ""),
        f"  budget: {budget_line(view.budget)}",
    ]
    if plan.limits:
        lines += ["", "Every limit, in the order it must be lifted:"]
        lines.append(table(["REASON", "MESSAGE"], [[str(x.reason), x.message] for x in plan.limits], "  "))
    if plan.skipped:
        lines += ["", f"Not handed out now ({len(plan.skipped)}):"]
        lines.append(table(["SHARD", "WHY"], sorted(plan.skipped.items()), "  "))
    return "\n".join(lines)


# --- events -----------------------------------------------------------------------------------------------


def render_timeline(view: TimelineView) -> str:
    attempts = f"attempt {view.attempt}" + (f" of {view.max_attempts}" if view.max_attempts else "")
    lines = [f"Shard {view.namespace}/{view.shard} (campaign {view.campaign}): {view.phase}, {attempts}"]
    if view.owner:
        lease = relative(view.lease_until, view.now)
        heartbeat = relative(view.last_heartbeat, view.now)
        progress = f"{view.progress[0]}/{view.progress[1]}" if view.progress else NONE
        lines.append(
            f"Claimed by {view.owner}: lease {lease}, last heartbeat {heartbeat}, progress {progress}"
        )
    error = view.last_error
    if error is not None:
        source = f" from source {error.source}" if error.source else ""
        event = f"event {error.event}" if error.event else "no event recorded"
        at = f", at {iso(error.at)}" if error.at else ""
        lines.append(
            f"Last error: {error.error_class}{source}: {error.message or '(no message)'} ({event}{at})"
        )
    lines.append("")
    if view.rows:
        rows = [
            [
                iso(r.at),
                r.reason + (" (Warning)" if r.type == "Warning" else ""),
                r.phase,
                r.attempt,
                r.owner,
                iso(r.lease_until),
                r.event,
                _note(r.note, r.error_class, r.source),
            ]
            for r in view.rows
        ]
        lines.append(
            table(["TIME", "REASON", "PHASE", "ATTEMPT", "OWNER", "LEASE UNTIL", "EVENT", "NOTE"], rows)
        )
    else:
        lines.append("No history and no events yet.")
    lines.extend(f"warning: {w}" for w in view.warnings)
    return "\n".join(lines)


def _note(note: str | None, error_class: str | None, source: str | None) -> str | None:
    if note:
        return note
    if error_class:
        return f"{error_class}" + (f" ({source})" if source else "")
    return None


# --- report -------------------------------------------------------------------------------------------


def render_report(view: ReportView) -> str:
    budget = view.budget
    items = ""
    if view.items_total is not None:
        items = f", {view.items_done} of {view.items_total} items in done shards"
    spent = budget_line(budget) + f"; shard costs add up to {view.shard_costs:g}"
    lines = [
        f"Closing report: campaign {view.namespace}/{view.name}, {view.phase}, at {iso(view.now)}",
        "",
        "Where it got",
        f"  {view.done} of {view.total} shards done ({percent(view.done, view.total)}){items}",
        f"  {phase_counts(view.counts, view.not_cut)}",
        "What it spent",
        f"  {spent}",
        "What is left",
        *(f"  - {line}" for line in view.left),
    ]
    if view.gave_up:
        rows = [[g.name, g.phase, g.attempt, g.error_class, g.event, g.message] for g in view.gave_up]
        lines.append(table(["SHARD", "PHASE", "ATTEMPT", "CLASS", "EVENT", "REASON"], rows, "    "))
    lines += ["", "Closing checklist (seed 000)"]
    for check in view.checks:
        mark = "PASS" if check.passed else "FAIL"
        lines.append(f"  [{mark}] {check.title}: {check.detail}")
        lines.extend(f"           - {o}" for o in check.offenders[:20])
        if len(check.offenders) > 20:
            lines.append(f"           - +{len(check.offenders) - 20} more (-o json lists all)")
    failed = [c for c in view.checks if not c.passed]
    lines.append("")
    if failed:
        lines.append(f"Result: {len(failed)} of {len(view.checks)} checks failed")
    else:
        lines.append(f"Result: all {len(view.checks)} checks passed")
    return "\n".join(lines)


# --- actions --------------------------------------------------------------------------------------


def render_action(result: ActionResult) -> str:
    lines = [f"campaign {result.namespace}/{result.name}: {result.message}"]
    if result.changed and result.event:
        lines.append(f"recorded as Event {result.event}" + (f" (by {result.user})" if result.user else ""))
    lines.extend(f"warning: {w}" for w in result.warnings)
    return "\n".join(lines)
