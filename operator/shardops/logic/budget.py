"""The budget breaker: at warn only finalize shards start, at the limit unclaimed shards pause, and
with maxPerShard a work shard starts only when its whole cap still fits the limit (a reservation).

Hitting the budget is not a failure: claimed shards finish and store their results.

The reservation: a shard's cost is cumulative over its attempts and the worker stops it once that
passes maxPerShard, so a shard may still spend `reservation(maxPerShard, cost)` = maxPerShard less
what it reported, never below 0. A work shard starts only while

    spent + Σ reservation(running shards) + reservation(the shard) ≤ limit

so the spend the shards report stays within the limit however many run at once. What this leaves
out (the finalize shard, the item that passes a shard's cap, claims raced on different views) is
written down in docs/user-guide.md, "The budget: how far over the limit can a campaign go".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from shardops.api.enums import ShardClass
from shardops.api.money import money_text


class BudgetGate(StrEnum):
    OPEN = "Open"
    WARN = "Warn"
    EXHAUSTED = "Exhausted"


def exact_ratio(ratio: float) -> Decimal:
    """A ratio of the spec (warnRatio) as the decimal it was written as, so money times it is exact."""
    return Decimal(str(ratio))


def budget_gate(spent: Decimal, limit: Decimal | None, warn_ratio: float) -> BudgetGate:
    """No limit means no gate. Compares by multiplication, so a zero limit is simply exhausted."""
    if not 0.0 < warn_ratio <= 1.0:
        raise ValueError(f"warn ratio must be in (0, 1], got {warn_ratio}")
    if limit is None:
        return BudgetGate.OPEN
    if spent >= limit:
        return BudgetGate.EXHAUSTED
    if spent >= exact_ratio(warn_ratio) * limit:
        return BudgetGate.WARN
    return BudgetGate.OPEN


def allows(gate: BudgetGate, shard_class: ShardClass) -> bool:
    """May a shard of this class start? Finalize shards (merge, validate, report) still may at warn."""
    if gate is BudgetGate.OPEN:
        return True
    return gate is BudgetGate.WARN and shard_class is ShardClass.FINALIZE


@dataclass(frozen=True)
class BudgetStatus:
    """`max_per_shard`: spec.budget.maxPerShard; with a limit it turns the reservation rule on."""

    gate: BudgetGate
    spent: Decimal
    limit: Decimal | None
    warn_ratio: float
    max_per_shard: Decimal | None = None

    @property
    def reserves(self) -> bool:
        """Do work shards reserve their cap at the claim? Only with both a limit and maxPerShard."""
        return self.limit is not None and self.max_per_shard is not None

    def describe(self) -> str:
        if self.limit is None:
            return f"spent {money_text(self.spent)}, no budget limit"
        share = f" ({self.spent / self.limit:.0%})" if self.limit > 0 else ""
        limit = money_text(self.limit)
        return f"spent {money_text(self.spent)} of {limit}{share}, warn at {self.warn_ratio:.0%}"


def budget_status(
    spent: Decimal, limit: Decimal | None, warn_ratio: float, max_per_shard: Decimal | None = None
) -> BudgetStatus:
    return BudgetStatus(budget_gate(spent, limit, warn_ratio), spent, limit, warn_ratio, max_per_shard)


def reservation(max_per_shard: Decimal | None, cost: Decimal) -> Decimal:
    """What a shard may still spend before the worker stops it at maxPerShard: the cap less what it
    reported over all its attempts, never below 0. Nothing without a cap (nothing bounds it)."""
    if max_per_shard is None:
        return Decimal(0)
    return max(Decimal(0), max_per_shard - cost)


def reserved(max_per_shard: Decimal | None, running_costs: Iterable[Decimal]) -> Decimal:
    """The budget the running shards hold: what each may still spend."""
    return sum((reservation(max_per_shard, cost) for cost in running_costs), Decimal(0))


def room(status: BudgetStatus, reserved_now: Decimal) -> Decimal | None:
    """The budget a new work shard may reserve: limit - spent - reserved; None without the rule."""
    if not status.reserves:
        return None
    assert status.limit is not None
    return status.limit - status.spent - reserved_now


def fits(need: Decimal, room_left: Decimal | None) -> bool:
    """May a work shard that reserves `need` start with `room_left` unreserved? Always without the rule."""
    return room_left is None or need <= room_left


def limit_to_start(status: BudgetStatus, reserved_now: Decimal, need: Decimal) -> Decimal:
    """The limit spec.budget.limit must pass for the next work shard to start: the gate must be
    open again (spent below warnRatio * limit) and, with the rule, its reservation must fit."""
    reopen = status.spent / exact_ratio(status.warn_ratio)
    if not status.reserves:
        return reopen
    return max(reopen, status.spent + reserved_now + need)


class HoldCause(StrEnum):
    """Why the budget keeps work shards from starting."""

    WARN_RATIO = "WarnRatio"
    LIMIT = "Limit"
    NO_ROOM = "NoRoom"


@dataclass(frozen=True)
class BudgetHold:
    """Work is left and the budget keeps it from starting.

    `waiting`: work shards left that have not started (cut or not); `running`: shards running or
    starting (claimable now), which hold `reserved` of the budget; `next_needs`: what the next held
    work shard would reserve (0 without maxPerShard); `raise_above`: the limit spec.budget.limit
    must pass for it to start.
    """

    cause: HoldCause
    waiting: int
    running: int
    reserved: Decimal
    next_needs: Decimal
    raise_above: Decimal

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, for `kubectl campaign plan|status -o json`."""
        return {
            "cause": str(self.cause),
            "waiting": self.waiting,
            "running": self.running,
            "reserved": money_text(self.reserved),
            "nextNeeds": money_text(self.next_needs),
            "raiseAbove": money_text(self.raise_above),
            "liftsItself": self.lifts_itself,
        }

    @property
    def lifts_itself(self) -> bool:
        """Running shards hold the room: as they finish, what they did not spend is free again."""
        return self.cause is HoldCause.NO_ROOM and self.running > 0

    def describe(self, status: BudgetStatus, campaign: str | None = None) -> str:
        """What holds the work and the fix; with `campaign`, also how to accept the campaign as it is."""
        waiting = f"{self.waiting} work shard(s) left"
        raise_it = f"raise spec.budget.limit above {money_text(self.raise_above)}"
        if self.cause is HoldCause.WARN_RATIO:
            text = f"{status.describe()}: from the warn ratio no work shard starts; {waiting} wait"
        elif self.cause is HoldCause.LIMIT:
            text = f"{status.describe()}: the limit is reached; {waiting} wait, paused"
        else:
            free = room(status, self.reserved)
            text = (
                f"{status.describe()}, {money_text(self.reserved)} reserved by {self.running} running or "
                f"starting shard(s): "
                f"{waiting} wait for room (the next needs {money_text(self.next_needs)}, maxPerShard "
                f"{money_text(status.max_per_shard or Decimal(0))} less its cost so far; "
                f"{money_text(max(free or Decimal(0), Decimal(0)))} of the limit is unreserved)"
            )
        if self.lifts_itself:
            return f"{text}; running shards free what they do not spend as they finish, or {raise_it}"
        accept = (
            f", or accept what is done: kubectl campaign cancel {campaign} (results stay readable)"
            if campaign
            else ""
        )
        return f"{text}; {raise_it} to go on{accept}"


@dataclass(frozen=True)
class CostLedger:
    """`reported` is the highest cumulative cost seen per report key (e.g. "<shard>/<attempt>")."""

    spent: Decimal
    reported: Mapping[str, Decimal]


def accumulate(
    prev_spent: Decimal, prev_reported: Mapping[str, Decimal], new_reports: Mapping[str, Decimal]
) -> CostLedger:
    """Adds only what each key reports beyond what was already counted.

    Reports are cumulative per key, so re-reading the same heartbeat adds nothing, and a lower,
    out-of-order reading never subtracts money that was already spent. Key by attempt if a worker
    restarts its counter on each attempt.
    """
    reported = dict(prev_reported)
    spent = prev_spent
    for key, cost in new_reports.items():
        seen = reported.get(key, Decimal(0))
        if cost > seen:
            spent += cost - seen
            reported[key] = cost
    return CostLedger(spent, reported)
