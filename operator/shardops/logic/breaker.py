"""Per-source circuit breaker: stop hammering a source that keeps answering "rate limited".

Only rate-limited failures count: a timeout or a bad input says nothing about quota, so other
classes neither count toward opening nor break the streak; a success resets it.
HalfOpen is derived from the clock (`effective`), so a breaker read back from status as HalfOpen
behaves exactly like an Open one whose cooldown has passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from shardops.api.enums import BreakerState, ErrorClass
from shardops.logic.timefmt import rfc3339


@dataclass(frozen=True)
class BreakerPolicy:
    threshold: int
    cooldown: timedelta

    def __post_init__(self) -> None:
        if self.threshold < 1:
            raise ValueError(f"breaker threshold must be at least 1, got {self.threshold}")
        if self.cooldown < timedelta(0):
            raise ValueError(f"breaker cooldown must not be negative, got {self.cooldown}")


@dataclass(frozen=True)
class SourceBreaker:
    state: BreakerState
    consecutive_rate_limited: int
    opened_at: datetime | None


CLOSED_BREAKER = SourceBreaker(BreakerState.CLOSED, 0, None)


def effective(breaker: SourceBreaker, now: datetime, cooldown: timedelta) -> BreakerState:
    """Open until the cooldown has passed, then HalfOpen: one probe may go through."""
    if breaker.state is BreakerState.CLOSED or breaker.opened_at is None:
        return BreakerState.CLOSED
    if now >= breaker.opened_at + cooldown:
        return BreakerState.HALF_OPEN
    return BreakerState.OPEN


def record_failure(
    breaker: SourceBreaker, error_class: ErrorClass, now: datetime, policy: BreakerPolicy
) -> SourceBreaker:
    if error_class is not ErrorClass.RATE_LIMITED:
        return breaker
    if breaker.state is not BreakerState.CLOSED:
        # A failed probe, or a call started before opening still being throttled: restart the cooldown.
        return replace(breaker, state=BreakerState.OPEN, opened_at=now)
    streak = breaker.consecutive_rate_limited + 1
    if streak >= policy.threshold:
        return SourceBreaker(BreakerState.OPEN, streak, now)
    return SourceBreaker(BreakerState.CLOSED, streak, None)


def record_success(breaker: SourceBreaker, now: datetime, policy: BreakerPolicy) -> SourceBreaker:
    if effective(breaker, now, policy.cooldown) is BreakerState.OPEN:
        # A late success from a call begun before opening says nothing about the quota now.
        return breaker
    return CLOSED_BREAKER


@dataclass(frozen=True)
class Route:
    """Where a shard's calls go. `probe` marks the single call allowed through a HalfOpen breaker."""

    source: str
    probe: bool


def route(
    source: str,
    breakers: Mapping[str, SourceBreaker],
    fallbacks: Mapping[str, str],
    now: datetime,
    cooldown: timedelta,
    *,
    probing: Set[str],
) -> Route | None:
    """The first usable source along `source → fallback → fallback …`, or None: claim nothing for it.

    `probing` holds HalfOpen sources whose one probe is already taken (in flight or granted).
    Unknown sources have never failed, so they are Closed.
    """
    seen: set[str] = set()
    current: str | None = source
    while current is not None and current not in seen:
        seen.add(current)
        state = effective(breakers.get(current, CLOSED_BREAKER), now, cooldown)
        if state is BreakerState.CLOSED:
            return Route(current, probe=False)
        if state is BreakerState.HALF_OPEN and current not in probing:
            return Route(current, probe=True)
        current = fallbacks.get(current)
    return None


def describe_blocked(
    source: str,
    breakers: Mapping[str, SourceBreaker],
    fallbacks: Mapping[str, str],
    now: datetime,
    cooldown: timedelta,
) -> str:
    """Why `route` found nothing, for `kubectl campaign plan` and skip reasons."""
    parts: list[str] = []
    seen: set[str] = set()
    current: str | None = source
    while current is not None and current not in seen:
        seen.add(current)
        breaker = breakers.get(current, CLOSED_BREAKER)
        state = effective(breaker, now, cooldown)
        if state is BreakerState.HALF_OPEN:
            parts.append(f"{current} half-open (probe in flight)")
        elif breaker.opened_at is not None:
            until = breaker.opened_at + cooldown
            parts.append(f"{current} open until {rfc3339(until)}")
        current = fallbacks.get(current)
    return "breaker: " + ", fallback ".join(parts)
