"""Is a claimed shard alive? The heartbeat table below.

| heartbeat | progress                     | verdict          | action                         |
| present   | rising                       | PROGRESSING      | none                           |
| present   | unchanged ≥ N heartbeats     | STUCK            | event + condition; policy      |
| missing   | (lease not expired)          | MAYBE_LONG_CALL  | wait for expiry, do not steal  |
| any       | lease expired                | ZOMBIE           | reclaim, attempt+1             |

Only heartbeats that carry attempt and progress count: an empty heartbeat is no heartbeat,
so the caller passes the time of the last *valid* one.

**Whose clock.** "Expired" and "missing" are judged on the observer's own monotonic clock — how long
it has not seen the claim renewed (`Renewals`), as client-go's leader election judges leader Leases —
never by comparing a holder's timestamps (renewTime, leaseUntil, lastHeartbeat) with the observer's
clock: two machines' clocks may disagree by any amount, and a holder whose clock runs 30 s behind
would otherwise be reclaimed seconds after it renewed, again and again. A holder's timestamps are
only compared with the same holder's timestamps (has its renewal mark risen?).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from shardops.api.enums import StallPolicy
from shardops.logic.timefmt import rfc3339
from shardops.logic.transitions import Action

# A heartbeat counts as present until one full beat has been missed: timer jitter and API
# latency must not flip a healthy worker to "missing", a second missed beat must.
_HEARTBEAT_PRESENCE_BEATS = 2


class LeaseVerdict(StrEnum):
    PROGRESSING = "Progressing"
    STUCK = "Stuck"
    MAYBE_LONG_CALL = "MaybeLongCall"
    ZOMBIE = "Zombie"


# A renewal mark must rise by more than this to count as a renewal. The shard's leaseUntil and the
# Lease's renewTime + leaseDurationSeconds are the same instant written twice; a serialisation that
# drops part of a second must not read as a renewal. Real renewals are a heartbeat (≥ 1 s) apart, and
# a rise too small to count is counted with the next one (the stored mark does not move meanwhile).
RENEWAL_RESOLUTION = timedelta(seconds=0.5)

# Silence of a claim that nobody holds (a Lease without a holder while its shard still says Running).
NOBODY_RENEWS = math.inf


@dataclass
class _Sighting:
    mark: datetime | None
    since: float


class Renewals:
    """When this process last saw each claim renewed, timed on its own monotonic clock.

    A claim is known by a key (its Lease's name), its holder, and a renewal mark the holder writes —
    the shard's leaseUntil or the Lease's renewTime + leaseDurationSeconds, the same instant. A holder
    seen for the first time, or a mark that rose, is a renewal seen now; anything else leaves the
    claim as silent as it was. Each holder of a key is timed on its own: a shard whose status still
    names its old owner while its Lease names the worker that took it over keeps both silences.
    A fresh observer (a restarted operator, a new leader, a new worker) has seen nothing yet: it waits
    a full lease duration from its first sight before it may call a claim expired.

    Bounded by the caller: `keep_only` drops every key it does not name (the window's Running shards,
    or the shards a worker's look holds); per key, one entry per holder seen while the caller kept
    it — a few, since each is a claim of that shard."""

    def __init__(self, clock: Callable[[], float]) -> None:
        """`clock`: this process's monotonic clock (`time.monotonic`; a stepped one in tests)."""
        self._clock = clock
        self._seen: dict[tuple[str, str | None], _Sighting] = {}

    def observe(self, key: str, holder: str | None, mark: datetime | None) -> float:
        """Seconds since `holder`'s claim under `key` was last seen renewed (0.0 on first sight)."""
        now = self._clock()
        seen = self._seen.get((key, holder))
        if seen is None:
            self._seen[(key, holder)] = _Sighting(mark, now)
            return 0.0
        if mark is not None and (seen.mark is None or mark > seen.mark + RENEWAL_RESOLUTION):
            seen.mark, seen.since = mark, now
        return now - seen.since

    def keep_only(self, keys: Collection[str]) -> None:
        wanted = set(keys)
        for pair in [pair for pair in self._seen if pair[0] not in wanted]:
            del self._seen[pair]

    def __len__(self) -> int:
        return len(self._seen)


@dataclass(frozen=True)
class LeaseObservation:
    """`silent_seconds`: how long the observer has not seen the claim renewed, on its own clock
    (`Renewals`); `lease_until` is the holder's own promise, quoted in messages only.
    `progress_changed_at` is when `done` last rose, or when the observer first saw the attempt."""

    lease_until: datetime
    silent_seconds: float
    lease_seconds: float
    last_heartbeat: datetime | None
    heartbeat_seconds: float
    progress_changed_at: datetime


@dataclass(frozen=True)
class LeaseClassification:
    verdict: LeaseVerdict
    reason: str


def classify_lease(obs: LeaseObservation, now: datetime, stall_heartbeats: int) -> LeaseClassification:
    if obs.heartbeat_seconds <= 0 or stall_heartbeats < 1:
        raise ValueError("heartbeat_seconds must be positive and stall_heartbeats at least 1")
    if is_expired(obs.silent_seconds, obs.lease_seconds):
        return _zombie(obs)
    if not heartbeat_present(obs.last_heartbeat, obs.heartbeat_seconds, obs.silent_seconds):
        return _maybe_long_call(obs)
    return _by_progress(obs, now, stall_heartbeats)


def is_expired(silent_seconds: float, lease_seconds: float) -> bool:
    """The one rule for "the holder stopped": not seen renewing for a full lease duration."""
    return silent_seconds >= lease_seconds


def heartbeat_present(
    last_heartbeat: datetime | None, heartbeat_seconds: float, silent_seconds: float
) -> bool:
    """A valid heartbeat was written, and the observer saw the claim renewed (every heartbeat renews
    it) within the presence window."""
    if last_heartbeat is None:
        return False
    return silent_seconds <= heartbeat_seconds * _HEARTBEAT_PRESENCE_BEATS


def _silence(obs: LeaseObservation) -> str:
    if math.isinf(obs.silent_seconds):
        return "nobody holds its Lease"
    return f"no renewal seen for {obs.silent_seconds:.0f}s"


def _zombie(obs: LeaseObservation) -> LeaseClassification:
    return LeaseClassification(
        LeaseVerdict.ZOMBIE,
        f"lease expired: {_silence(obs)} (leaseSeconds {obs.lease_seconds:g}; the holder's "
        f"leaseUntil {rfc3339(obs.lease_until)})",
    )


def _maybe_long_call(obs: LeaseObservation) -> LeaseClassification:
    seen = "no heartbeat yet" if obs.last_heartbeat is None else f"{_silence(obs)}"
    return LeaseClassification(
        LeaseVerdict.MAYBE_LONG_CALL,
        f"{seen}, lease valid for {obs.lease_seconds - obs.silent_seconds:.0f}s more: waiting, not stealing",
    )


def _by_progress(obs: LeaseObservation, now: datetime, stall_heartbeats: int) -> LeaseClassification:
    still = now - obs.progress_changed_at
    window = timedelta(seconds=obs.heartbeat_seconds * stall_heartbeats)
    if still >= window:
        return LeaseClassification(
            LeaseVerdict.STUCK,
            f"heartbeating but no progress for {still.total_seconds():.0f}s "
            f"(≥ {stall_heartbeats} heartbeats of {obs.heartbeat_seconds:g}s)",
        )
    return LeaseClassification(LeaseVerdict.PROGRESSING, "heartbeating with progress")


def track_progress(
    prev_done: int, prev_changed_at: datetime, new_done: int, heartbeat_at: datetime
) -> datetime:
    """The new `progress_changed_at` after a heartbeat: moves only when `done` rises.

    At claim, `prev_done` is the count already done (items resumed by sub-key) and
    `prev_changed_at` the claim time.
    """
    if new_done > prev_done:
        return heartbeat_at
    return prev_changed_at


def lease_action(
    verdict: LeaseVerdict, stall_policy: StallPolicy, attempt: int, max_attempts: int
) -> Action | None:
    """What the operator does about a verdict; None means leave the shard alone.

    Losing the lease (or being revoked) uses up the attempt; on the last one the shard blocks
    instead of looping forever on a poison input that kills every worker.
    """
    if verdict is LeaseVerdict.ZOMBIE:
        return Action.RECLAIM if attempt < max_attempts else Action.BLOCK
    if verdict is LeaseVerdict.STUCK and stall_policy is StallPolicy.REVOKE:
        return Action.REVOKE if attempt < max_attempts else Action.BLOCK
    return None
