"""Builders shared by the logic tests (no tests here): one place to spell a ShardView or plan inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from shardops.api.enums import ShardClass, ShardPhase
from shardops.logic.backpressure import NO_WORKER_FAILURES, WorkerFailures
from shardops.logic.breaker import SourceBreaker
from shardops.logic.budget import BudgetStatus, budget_status
from shardops.logic.planner import Breakers, DispatchInputs, DispatchLimits, WorkerCounts
from shardops.logic.shardview import ItemProgress, ShardView

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


def money(amount: float | Decimal) -> Decimal:
    """An amount as the code holds it (a Decimal), from the literal a test spells: 2.5 is 2.5."""
    return amount if isinstance(amount, Decimal) else Decimal(str(amount))


def budget_at(
    spent: float | Decimal,
    limit: float | Decimal | None,
    warn_ratio: float,
    cap: float | Decimal | None = None,
) -> BudgetStatus:
    """budget_status with the amounts as Decimals."""
    return budget_status(
        money(spent),
        None if limit is None else money(limit),
        warn_ratio,
        None if cap is None else money(cap),
    )


def shard(
    name: str,
    phase: ShardPhase = ShardPhase.PENDING,
    *,
    shard_class: ShardClass = ShardClass.WORK,
    priority: int = 0,
    index: int | None = None,
    attempt: int = 1,
    source: str | None = None,
    not_before: datetime | None = None,
    since: datetime = NOW,
    cost: float | Decimal = 0,
) -> ShardView:
    order = index if index is not None else int("".join(c for c in name if c.isdigit()) or 0)
    return ShardView(
        name, phase, shard_class, priority, order, attempt, source, not_before, since, money(cost)
    )


def inputs(
    shards: Sequence[ShardView],
    *,
    max_concurrency: int = 6,
    backlog_ratio: float = 5,
    total_items: int = 0,
    cut_items: int = 0,
    shard_size: int = 10,
    breakers: Mapping[str, SourceBreaker] | None = None,
    fallbacks: Mapping[str, str] | None = None,
    cooldown: timedelta = timedelta(minutes=5),
    budget: BudgetStatus | None = None,
    suspended: bool = False,
    alive_jobs: int | None = None,
    alive_slots: int | None = None,
    slots_per_worker: int = 1,
    running_pods: int | None = None,
    stuck_pending_pods: int = 0,
    recent_failures: WorkerFailures = NO_WORKER_FAILURES,
    now: datetime = NOW,
) -> DispatchInputs:
    """Defaults describe a healthy campaign: one live worker pod per running shard, no budget."""
    running = sum(1 for s in shards if s.phase is ShardPhase.RUNNING)
    return DispatchInputs(
        limits=DispatchLimits(max_concurrency, backlog_ratio, slots_per_worker),
        items=ItemProgress(total_items, cut_items, shard_size),
        shards=tuple(shards),
        breakers=Breakers(dict(breakers or {}), dict(fallbacks or {}), cooldown),
        budget=budget or budget_at(0, None, 0.8),
        suspended=suspended,
        workers=WorkerCounts(
            running if alive_jobs is None else alive_jobs,
            (running if alive_jobs is None else alive_jobs) if alive_slots is None else alive_slots,
            running if running_pods is None else running_pods,
            stuck_pending_pods,
            recent_failures,
        ),
        now=now,
    )
