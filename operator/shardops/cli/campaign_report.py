"""`kubectl campaign report NAME`: the closing report and the closing checklist.

Where the campaign got, what it spent, what is left, and the checklist to pass before calling it done:
every Done shard has a result fingerprint; every Failed/Blocked shard has a reason and an event name;
not many shards used all their attempts; the budget spent matches the shards' costs; no one but shardops
wrote shard state. Any failing line makes the exit code 1. The view and its text are pure; `run_report`
does the reads.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from shardops.api.campaign import Campaign
from shardops.api.common import JSON, TokenCounts
from shardops.api.enums import ShardPhase
from shardops.api.folded import FoldedShards
from shardops.api.money import money_text
from shardops.api.names import SHARDOPS_FIELD_MANAGERS
from shardops.api.shard import Shard
from shardops.cli.campaign_client import EXIT_BAD_STATE, EXIT_OK
from shardops.cli.campaign_list import budget_hold
from shardops.cli.campaign_summary import (
    budget_dict,
    budget_line,
    counts_dict,
    parse_shards,
    phase_counts,
)
from shardops.cli.command import Context, load
from shardops.cli.text import iso, percent, table
from shardops.logic.budget import BudgetGate, BudgetStatus
from shardops.state import ledger
from shardops.state.summary import recorded_items_total, summarize_listed

# Closing checklist: "attempt distribution normal (not many shards at the maximum)". Many means more
# than this share of the shards, and at least MAX_ATTEMPTS_MIN_COUNT of them.
MAX_ATTEMPTS_SHARE = 0.2
MAX_ATTEMPTS_MIN_COUNT = 2


# --- view (what -o json|yaml prints) ------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One line of the closing checklist: `passed`, with what was found (`detail`) and the shards at fault."""

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
    items_errored: int
    budget: BudgetStatus
    shard_costs: Decimal
    status_spent: Decimal
    tokens: TokenCounts
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
                "counts": counts_dict(self.counts),
                "notYetCut": self.not_cut,
                "doneShards": self.done,
                "totalShards": self.total,
                "itemsDone": self.items_done,
                "itemsErrored": self.items_errored,
                "itemsTotal": self.items_total,
            },
            "spent": {
                **budget_dict(self.budget),
                "statusSpent": money_text(self.status_spent),
                "shardCosts": money_text(self.shard_costs),
                "tokens": self.tokens.to_dict(),
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
    live = summarize_listed(campaign, shards, now)
    agg, counts, not_cut = live.aggregate, live.counts, live.not_cut
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
    # Folded shards' costs were summed into status.folded.cost when they were folded.
    shard_costs = status.folded.cost + sum((s.current_status.cost for s in shards), Decimal(0))
    checks = (
        check_fingerprints(shards, campaign.current_status.folded.shards),
        check_failure_records(shards),
        check_attempts(shards, spec.max_attempts, status.folded),
        check_spend(status.spent, shard_costs, campaign.status is not None),
        check_managers(shard_bodies),
    )
    items_done = status.folded.items + sum(
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
        items_total=recorded_items_total(campaign),
        items_errored=ledger.campaign_errored_items(status.folded, shards),
        budget=agg.budget,
        shard_costs=shard_costs,
        status_spent=status.spent,
        tokens=ledger.campaign_tokens(status.tokens, status.folded, shards),
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
    folded = campaign.current_status.folded.gave_up
    if folded:
        # Gone from the API, so not in the table below: the ledger holds their errors.
        lines.append(
            f"{folded} of them folded into the ledger: kubectl campaign results {name} --failed lists "
            "their items and errors"
        )
    hold = budget_hold(campaign.current_status.to_dict())
    if hold is not None:
        lines.append(f"held by budget: {hold}")
    if budget.limit is not None:
        left = max(budget.limit - budget.spent, Decimal(0))
        lines.append(f"budget left: {money_text(left)} of {money_text(budget.limit)}")
    if not lines:
        lines.append("nothing: every shard is done")
    return tuple(lines)


def check_fingerprints(shards: Sequence[Shard], folded: int = 0) -> Check:
    """Live Done shards are checked one by one; folded ones were folded only with a result (its
    reference and fingerprint are in the ledger)."""
    done = [s for s in shards if s.phase is ShardPhase.DONE]
    missing = tuple(
        s.name for s in done if s.current_status.result is None or not s.current_status.result.fingerprint
    )
    title = "every Done shard has a result fingerprint"
    if missing:
        return Check(
            "result-fingerprints", title, False, f"{len(missing)} of {len(done)} without one", missing
        )
    ledger = f" (and the {folded} folded into the ledger)" if folded else ""
    return Check("result-fingerprints", title, True, f"{len(done)} of {len(done)} have one{ledger}")


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


def check_attempts(shards: Sequence[Shard], max_attempts: int, folded: FoldedShards | None = None) -> Check:
    """Over the live shards; folded ones (gone from the API) are summed in status.folded."""
    title = f"attempt distribution normal (not many shards at maxAttempts {max_attempts})"
    started = [s for s in shards if s.current_status.attempt > 0]
    spread = Counter(s.current_status.attempt for s in started)
    shape = ", ".join(f"attempt {a}: {n}" for a, n in sorted(spread.items())) or "no live shard attempted"
    if folded is not None and folded.total:
        ledger = f"{folded.total} shard(s) folded into the ledger, {folded.attempts} attempt(s) in all"
        shape += f" (and {ledger})"
    at_max = tuple(s.name for s in started if s.current_status.attempt >= max_attempts)
    many = len(at_max) >= MAX_ATTEMPTS_MIN_COUNT and len(at_max) > MAX_ATTEMPTS_SHARE * len(started)
    detail = (
        f"{shape}; {len(at_max)} of {len(started)} at maxAttempts (flagged above {MAX_ATTEMPTS_SHARE:.0%})"
    )
    return Check("attempt-distribution", title, not many, detail, at_max if many else ())


def check_spend(status_spent: Decimal, shard_costs: Decimal, has_status: bool) -> Check:
    title = "budget spent matches the sum of shard costs"
    if not has_status:
        return Check("spend-matches", title, False, "the operator has not written a status yet")
    # Exact: costs are decimals, summed in any order to the same amount.
    ok = status_spent == shard_costs
    detail = f"status.spent {money_text(status_spent)}, shard costs add up to {money_text(shard_costs)}"
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


# --- text ---------------------------------------------------------------------------------------------


def render_report(view: ReportView) -> str:
    budget = view.budget
    items = ""
    if view.items_total is not None:
        items = f", {view.items_done} of {view.items_total} items in done shards"
    if view.items_errored:
        items += f" ({view.items_errored} of them errored: kubectl campaign results --failed)"
    spent = budget_line(budget) + f"; shard costs add up to {money_text(view.shard_costs)}"
    lines = [
        f"Closing report: campaign {view.namespace}/{view.name}, {view.phase}, at {iso(view.now)}",
        "",
        "Where it got",
        f"  {view.done} of {view.total} shards done ({percent(view.done, view.total)}){items}",
        f"  {phase_counts(view.counts, view.not_cut)}",
        "What it spent",
        f"  {spent}",
        *([f"  tokens: {view.tokens.describe()}"] if view.tokens.used else []),
        "What is left",
        *(f"  - {line}" for line in view.left),
    ]
    if view.gave_up:
        rows = [[g.name, g.phase, g.attempt, g.error_class, g.event, g.message] for g in view.gave_up]
        lines.append(table(["SHARD", "PHASE", "ATTEMPT", "CLASS", "EVENT", "REASON"], rows, "    "))
    lines += ["", "Closing checklist"]
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


# --- command ------------------------------------------------------------------------------------------


def run_report(ctx: Context) -> int:
    _, campaign, shard_bodies, _ = load(ctx, ctx.args.name)
    view = report_view(campaign, shard_bodies, ctx.clock())
    ctx.show(view, render_report)
    return EXIT_OK if view.passed else EXIT_BAD_STATE
