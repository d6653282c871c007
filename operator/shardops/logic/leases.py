"""Is a claimed shard alive? The heartbeat table below, decided from timestamps alone.

| heartbeat | progress                     | verdict          | action                         |
| present   | rising                       | PROGRESSING      | none                           |
| present   | unchanged ≥ N heartbeats     | STUCK            | event + condition; policy      |
| missing   | (lease not expired)          | MAYBE_LONG_CALL  | wait for expiry, do not steal  |
| any       | lease expired                | ZOMBIE           | reclaim, attempt+1             |

Only heartbeats that carry attempt and progress count: an empty heartbeat is no heartbeat,
so the caller passes the time of the last *valid* one.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class LeaseObservation:
    """`progress_changed_at` is when `done` last rose, or the claim time until it first does."""

    lease_until: datetime
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
    if now >= obs.lease_until:
        return _zombie(obs, now)
    if not heartbeat_present(obs.last_heartbeat, obs.heartbeat_seconds, now):
        return _maybe_long_call(obs, now)
    return _by_progress(obs, now, stall_heartbeats)


def heartbeat_present(last_heartbeat: datetime | None, heartbeat_seconds: float, now: datetime) -> bool:
    if last_heartbeat is None:
        return False
    return now - last_heartbeat <= timedelta(seconds=heartbeat_seconds * _HEARTBEAT_PRESENCE_BEATS)


def _zombie(obs: LeaseObservation, now: datetime) -> LeaseClassification:
    late = (now - obs.lease_until).total_seconds()
    return LeaseClassification(
        LeaseVerdict.ZOMBIE, f"lease expired at {rfc3339(obs.lease_until)} ({late:.0f}s ago)"
    )


def _maybe_long_call(obs: LeaseObservation, now: datetime) -> LeaseClassification:
    if obs.last_heartbeat is None:
        seen = "no heartbeat yet"
    else:
        seen = f"last heartbeat {(now - obs.last_heartbeat).total_seconds():.0f}s ago"
    return LeaseClassification(
        LeaseVerdict.MAYBE_LONG_CALL,
        f"{seen}, lease valid until {rfc3339(obs.lease_until)}: waiting, not stealing",
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
