"""`kubectl campaign list`: every campaign of a namespace (or all of them) at a glance.

One list call, whatever the number of shards: each row is what the operator last wrote in the
Campaign's status. The rows and their text are pure; `run_list` does the read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from shardops import API_GROUP
from shardops.api.common import JSON
from shardops.api.enums import ConditionReason, ConditionStatus, ConditionType
from shardops.api.money import money_or_none, money_text, parse_money
from shardops.api.names import CAMPAIGN_KIND, CANCELLED_ANNOTATION
from shardops.cli.campaign_client import EXIT_OK
from shardops.cli.command import Context
from shardops.cli.text import as_json, as_yaml, duration, percent, table
from shardops.k8s.leases import parse_time

# --- view (what -o json|yaml prints) ------------------------------------------------------------------


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
    spent: Decimal
    budget: Decimal | None
    suspended: bool
    cancelled: str | None
    age_seconds: float | None
    # The operator's BudgetHeld condition says nothing more starts by itself (its fix is in its message).
    budget_held: bool = False

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
            "spent": money_text(self.spent),
            "budget": money_or_none(self.budget),
            "suspended": self.suspended,
            "cancelled": self.cancelled,
            "budgetHeld": self.budget_held,
            "ageSeconds": self.age_seconds,
        }


def seconds_between(later: dt.datetime | None, earlier: dt.datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def budget_hold(status: JSON) -> str | None:
    """The BudgetHeld condition's message (it names the fix) while it is True for a reason no running
    shard lifts (ReservedByRunning clears itself); None otherwise."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == str(ConditionType.BUDGET_HELD):
            held = condition.get("status") == str(ConditionStatus.TRUE)
            if held and condition.get("reason") != str(ConditionReason.RESERVED_BY_RUNNING):
                return str(condition.get("message") or "held by the budget")
            return None
    return None


def held_by_budget(status: JSON) -> bool:
    return budget_hold(status) is not None


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
                spent=_amount(status.get("spent")) or Decimal(0),
                budget=_amount((spec.get("budget") or {}).get("limit")),
                suspended=bool(spec.get("suspend")),
                cancelled=(metadata.get("annotations") or {}).get(CANCELLED_ANNOTATION),
                age_seconds=seconds_between(now, created),
                budget_held=held_by_budget(status),
            )
        )
    return sorted(rows, key=lambda r: (r.namespace, r.name))


def _amount(value: object) -> Decimal | None:
    """An amount of a raw body; None when absent or not an amount (the list shows what it can)."""
    try:
        return None if value is None else parse_money(value)
    except ValueError:
        return None


# --- text ---------------------------------------------------------------------------------------------


def render_list(rows: Sequence[CampaignRow], *, all_namespaces: bool, no_headers: bool = False) -> str:
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
        elif r.budget_held:
            phase += " (held by budget)"
        spent = money_text(r.spent) + (
            f"/{money_text(r.budget)} ({percent(r.spent, r.budget)})" if r.budget else "/-"
        )
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
    return table(headers, lines, no_headers=no_headers)


def render_names(rows: Sequence[CampaignRow]) -> str:
    """`-o name`, as kubectl prints it: kind.group/name, one a line, no namespace even with -A."""
    return "\n".join(f"{CAMPAIGN_KIND.lower()}.{API_GROUP}/{r.name}" for r in rows)


# --- command ------------------------------------------------------------------------------------------


def run_list(ctx: Context) -> int:
    all_namespaces = bool(ctx.args.all_namespaces)
    namespace = None if all_namespaces else ctx.namespace
    rows = campaign_rows(ctx.client.list_campaigns(namespace), ctx.clock())
    if ctx.output == "name":
        if rows:  # kubectl prints nothing at all for an empty list here
            ctx.out(render_names(rows))
        return EXIT_OK
    if ctx.output != "human":
        data = {"items": [r.as_dict() for r in rows]}
        ctx.out(as_json(data) if ctx.output == "json" else as_yaml(data))
        return EXIT_OK
    if not rows:
        ctx.err("No campaigns found" + ("." if all_namespaces else f" in namespace {namespace}."))
        return EXIT_OK
    ctx.out(render_list(rows, all_namespaces=all_namespaces, no_headers=bool(ctx.args.no_headers)))
    return EXIT_OK
