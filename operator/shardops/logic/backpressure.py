"""Backpressure: how much new work the campaign may take on, and when more workers would not help.

A backlog far larger than what is running means shards are too fine or downstream too slow; adding
shards (or machines) only empties the queue faster into a throttled source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction

# A worker that dies at start (RBAC, configuration, a broken image) would be replaced every tick:
# after this many failures in the window, new Jobs wait until no worker failed for the quiet time.
WORKER_FAILURE_WINDOW = timedelta(minutes=5)
WORKER_FAILURE_QUIET = timedelta(seconds=60)
MIN_WORKER_FAILURES = 3


@dataclass(frozen=True)
class WorkerFailures:
    """Worker Jobs that failed within WORKER_FAILURE_WINDOW: how many, the newest one's time and reason."""

    count: int = 0
    last_at: datetime | None = None
    last_reason: str = ""

    def holding(self, workers_at_cap: int, now: datetime) -> bool:
        """Stop starting Jobs for now: many workers failed lately (as many Jobs as run the campaign at
        its cap, `workers_at_cap`, and at least MIN_WORKER_FAILURES) and the last one only just did."""
        too_many = self.count >= max(MIN_WORKER_FAILURES, workers_at_cap)
        return too_many and self.last_at is not None and now - self.last_at < WORKER_FAILURE_QUIET

    def describe(self) -> str:
        minutes = WORKER_FAILURE_WINDOW.total_seconds() / 60
        return (
            f"{self.count} worker Job(s) failed in the last {minutes:.0f}m "
            f"(last: {self.last_reason}); no new workers until none fails for "
            f"{WORKER_FAILURE_QUIET.total_seconds():.0f}s: read the worker pods' logs"
        )


NO_WORKER_FAILURES = WorkerFailures()


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


def uncut_shards(total_items: int, cut_items: int, shard_size: int) -> int:
    """Work shards not yet cut from the items (the last one may be short)."""
    if shard_size < 1:
        raise ValueError(f"shard size must be at least 1, got {shard_size}")
    return math.ceil(max(0, total_items - cut_items) / shard_size)


def cluster_full(stuck_pending_pods: int, running_pods: int) -> bool:
    """Stop starting Jobs once at least as many worker pods are stuck Pending as are running.

    New Jobs would only queue behind the stuck pods. With nothing running, a single stuck pod
    is enough to stop; with pods running, the cluster is still partly serving us, so a minority of
    stuck pods (e.g. one node full) does not stop the campaign from using the rest.
    "Stuck" is the caller's call (e.g. PodScheduled=False with reason Unschedulable).
    """
    return stuck_pending_pods >= max(1, running_pods)


def slots_to_start(max_concurrency: int, claimable: int, running: int, alive_slots: int) -> int:
    """Keep min(maxConcurrency, claimable + running) worker slots alive; never more than there is to
    claim. A slot runs one shard at a time (a worker pod has spec.worker.slots of them).

    `claimable` counts shards claimable now and those only the backlog bound keeps from being cut
    yet (the planner's `_coming`). Capping by it stops a dead worker's still-Running shard from
    spawning an idle Job.
    """
    wanted = min(max_concurrency, claimable + running) - alive_slots
    return max(0, min(wanted, claimable))


def worker_jobs(slots: int, slots_per_worker: int) -> tuple[int, ...]:
    """The slots of each worker Job that starts `slots` slots: full Jobs of `slots_per_worker`, the
    last one the rest (so no more slots start than are wanted)."""
    if slots_per_worker < 1:
        raise ValueError(f"slots per worker must be at least 1, got {slots_per_worker}")
    full, rest = divmod(max(0, slots), slots_per_worker)
    return (slots_per_worker,) * full + ((rest,) if rest else ())
