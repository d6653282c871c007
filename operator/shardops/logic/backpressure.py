"""Backpressure: how much new work the campaign may take on, and when more workers would not help.

A backlog far larger than what is running means shards are too fine or downstream too slow; adding
shards (or machines) only empties the queue faster into a throttled source.
"""

from __future__ import annotations

import math
from fractions import Fraction


def backlog_bound(backlog_ratio: float, running: int) -> int:
    """Most Pending shards allowed: ratio · max(running, 1), so an idle campaign can still start.

    Fraction(str(...)) keeps decimal ratios exact: 0.29 · 100 must be 29, not 28.999….
    """
    if backlog_ratio <= 0:
        raise ValueError(f"backlog ratio must be positive, got {backlog_ratio}")
    return math.floor(Fraction(str(backlog_ratio)) * max(running, 1))


def backlog_room(pending: int, backlog_ratio: float, running: int) -> int:
    """How many shards may become Pending now without passing the bound."""
    return max(0, backlog_bound(backlog_ratio, running) - pending)


def remaining_shards(total_items: int, materialized_items: int, shard_size: int) -> int:
    """Shards still to cut from the items not yet materialized (the last one may be short)."""
    if shard_size < 1:
        raise ValueError(f"shard size must be at least 1, got {shard_size}")
    return math.ceil(max(0, total_items - materialized_items) / shard_size)


def cluster_full(stuck_pending_pods: int, running_pods: int) -> bool:
    """Stop starting Jobs once at least as many worker pods are stuck Pending as are running.

    New Jobs would only queue behind the stuck pods. With nothing running, a single stuck pod
    is enough to stop; with pods running, the cluster is still partly serving us, so a minority of
    stuck pods (e.g. one node full) does not stop the campaign from using the rest.
    "Stuck" is the caller's call (e.g. PodScheduled=False with reason Unschedulable).
    """
    return stuck_pending_pods >= max(1, running_pods)


def workers_to_start(max_concurrency: int, claimable: int, running: int, alive: int) -> int:
    """Keep min(maxConcurrency, claimable + running) workers alive; never more than there is to claim.

    Capping by `claimable` stops a dead worker's still-Running shard from spawning an idle Job.
    """
    wanted = min(max_concurrency, claimable + running) - alive
    return max(0, min(wanted, claimable))
