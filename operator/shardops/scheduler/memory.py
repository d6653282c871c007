"""What one campaign's passes remember between passes (`Memory`), on this process only.

Losing it (restart, failover) only delays stall and zombie detection (by up to a stall window, a
lease duration) and reads the items once more. Which history entries are folded is not here: the
status says it (status.historyFolded), per shard, and a new leader reads it there."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardops.api.common import Item
from shardops.logic.leases import Renewals


@dataclass
class Progress:
    """When a running shard's progress last rose, as this process saw it (for stall detection)."""

    attempt: int
    done: int
    changed_at: dt.datetime
    reported: bool = False


@dataclass
class Memory:
    """One campaign's: the items read for its spec generation, the progress and claim renewals the
    sweep judges from, the shard changes already seen, and the coalescing of requests for a pass."""

    items_key: tuple[str, int, str] | None = None
    items: Sequence[Item] = field(default_factory=list)
    # Bounded by the window: the Running shards of the last pass (the sweep drops the others).
    progress: dict[str, Progress] = field(default_factory=dict)
    # When each Running shard's claim was last seen renewed, on this process's clock: expiry is
    # judged from it, never from the holder's timestamps (`logic.leases`, "Whose clock").
    renewals: Renewals = field(default_factory=lambda: Renewals(time.monotonic))
    shard_seen: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Coalescing of concurrent requests: one pass at a time, and one more if asked meanwhile.
    running: bool = False
    again: bool = False
    last_started: float = 0.0
