"""What the decisions need to know about one shard: a flat, frozen view the operator fills from a Shard."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from shardops.api.enums import ShardClass, ShardPhase


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
    cost: float
