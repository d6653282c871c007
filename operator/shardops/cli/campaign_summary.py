"""What `status`, `plan` and `report` show alike: the shards in order, counts per phase, the item count and
the budget, as data (`-o json|yaml`) and as text. Pure: no I/O, no clock. The counts and the budget
themselves are the operator's (`state.summary`): here is only how they are shown."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from pydantic import ValidationError

from shardops.api.common import JSON
from shardops.api.enums import ShardClass, ShardPhase
from shardops.api.money import money_or_none, money_text
from shardops.api.shard import Shard
from shardops.cli.text import percent
from shardops.logic.budget import BudgetHold, BudgetStatus

PHASE_ORDER = (
    ShardPhase.QUEUED,
    ShardPhase.PENDING,
    ShardPhase.RUNNING,
    ShardPhase.PAUSED,
    ShardPhase.DONE,
    ShardPhase.FAILED,
    ShardPhase.BLOCKED,
)


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


def counts_dict(counts: Mapping[ShardPhase, int]) -> JSON:
    """Shards per phase for `-o json|yaml`: every phase, lower-case, in PHASE_ORDER."""
    return {str(p).lower(): counts[p] for p in PHASE_ORDER}


def phase_counts(counts: Mapping[ShardPhase, int], not_cut: int) -> str:
    parts = []
    for phase in PHASE_ORDER:
        text = f"{str(phase).lower()} {counts[phase]}"
        if phase is ShardPhase.QUEUED and not_cut:
            text = f"queued {counts[phase] + not_cut} ({not_cut} not yet cut)"
        parts.append(text)
    return " · ".join(parts)


def budget_dict(
    budget: BudgetStatus, reserved: Decimal = Decimal(0), hold: BudgetHold | None = None, campaign: str = ""
) -> JSON:
    """`reserved`: what the running shards may still spend under maxPerShard; `hold`: the planner's
    budget hold (work left that the budget keeps from starting), with the fix in `message`."""
    return {
        "spent": money_text(budget.spent),
        "limit": money_or_none(budget.limit),
        "ratio": float(budget.spent / budget.limit) if budget.limit else None,
        "warnRatio": budget.warn_ratio if budget.limit is not None else None,
        "maxPerShard": money_or_none(budget.max_per_shard),
        "reserved": money_text(reserved) if budget.reserves else None,
        "gate": str(budget.gate),
        "hold": None
        if hold is None
        else {**hold.as_dict(), "message": hold.describe(budget, campaign or None)},
    }


def budget_line(budget: BudgetStatus, reserved: Decimal = Decimal(0)) -> str:
    if budget.limit is None:
        return f"spent {money_text(budget.spent)}, no budget limit"
    line = (
        f"spent {money_text(budget.spent)} of {money_text(budget.limit)} "
        f"({percent(budget.spent, budget.limit)}), "
        f"warn at {budget.warn_ratio:.0%}: gate {budget.gate}"
    )
    if budget.max_per_shard is None:
        return line
    cap = money_text(budget.max_per_shard)
    return f"{line}; {money_text(reserved)} reserved by running shards (maxPerShard {cap} each)"
