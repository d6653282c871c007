"""What the decisions need to know about one shard: a flat, frozen view the operator fills from a Shard."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from shardops.api.enums import ShardClass, ShardPhase
from shardops.logic.backpressure import uncut_shards


@dataclass(frozen=True)
class ShardView:
    """One shard as the planner and the aggregator see it.

    `index` is the creation order (FIFO tie-break within a priority); `priority` is higher-first.
    `attempt` is 1-based: the number of the current attempt, or of the next one while Pending.
    `since` is when the shard entered its current phase (drives "oldest pending" age).
    `cost` is everything this shard has reported spending, over all its attempts.
    `source` is the upstream the shard calls; None when it declares none (no breaker applies).
    """

    name: str
    phase: ShardPhase
    shard_class: ShardClass
    priority: int
    index: int
    attempt: int
    source: str | None
    not_before: datetime | None
    since: datetime
    cost: Decimal


@dataclass(frozen=True)
class ItemProgress:
    """The campaign's work items: how many exist and how many are already cut into shards."""

    total_items: int
    cut_items: int
    shard_size: int

    def __post_init__(self) -> None:
        if self.total_items < 0 or self.cut_items < 0:
            raise ValueError("item counts must not be negative")
        if self.shard_size < 1:
            raise ValueError(f"shard size must be at least 1, got {self.shard_size}")

    @property
    def uncut_shards(self) -> int:
        return uncut_shards(self.total_items, self.cut_items, self.shard_size)
