"""The budget breaker: at warn only finalize shards start, at the limit unclaimed shards pause.

Hitting the budget is not a failure: claimed shards finish and store their results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from shardops.api.enums import ShardClass


class BudgetGate(StrEnum):
    OPEN = "Open"
    WARN = "Warn"
    EXHAUSTED = "Exhausted"


def budget_gate(spent: float, limit: float | None, warn_ratio: float) -> BudgetGate:
    """No limit means no gate. Compares by multiplication, so a zero limit is simply exhausted."""
    if not 0.0 < warn_ratio <= 1.0:
        raise ValueError(f"warn ratio must be in (0, 1], got {warn_ratio}")
    if limit is None:
        return BudgetGate.OPEN
    if spent >= limit:
        return BudgetGate.EXHAUSTED
    if spent >= warn_ratio * limit:
        return BudgetGate.WARN
    return BudgetGate.OPEN


def allows(gate: BudgetGate, shard_class: ShardClass) -> bool:
    """May a shard of this class start? Finalize shards (merge, validate, report) still may at warn."""
    if gate is BudgetGate.OPEN:
        return True
    return gate is BudgetGate.WARN and shard_class is ShardClass.FINALIZE


@dataclass(frozen=True)
class BudgetStatus:
    gate: BudgetGate
    spent: float
    limit: float | None
    warn_ratio: float

    def describe(self) -> str:
        if self.limit is None:
            return f"spent {self.spent:g}, no budget limit"
        share = f" ({self.spent / self.limit:.0%})" if self.limit > 0 else ""
        return f"spent {self.spent:g} of {self.limit:g}{share}, warn at {self.warn_ratio:.0%}"


def budget_status(spent: float, limit: float | None, warn_ratio: float) -> BudgetStatus:
    return BudgetStatus(budget_gate(spent, limit, warn_ratio), spent, limit, warn_ratio)


@dataclass(frozen=True)
class CostLedger:
    """`reported` is the highest cumulative cost seen per report key (e.g. "<shard>/<attempt>")."""

    spent: float
    reported: Mapping[str, float]


def accumulate(
    prev_spent: float, prev_reported: Mapping[str, float], new_reports: Mapping[str, float]
) -> CostLedger:
    """Adds only what each key reports beyond what was already counted.

    Reports are cumulative per key, so re-reading the same heartbeat adds nothing, and a lower,
    out-of-order reading never subtracts money that was already spent. Key by attempt if a worker
    restarts its counter on each attempt.
    """
    reported = dict(prev_reported)
    spent = prev_spent
    for key, cost in new_reports.items():
        seen = reported.get(key, 0.0)
        if cost > seen:
            spent += cost - seen
            reported[key] = cost
    return CostLedger(spent, reported)
