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


# --- one breaker per shared Source ------------------------------------------------------------------
#
# Every campaign folds its own breaker for each of its sources from its own shards' history (above).
# For a source that refers to a shared Source, the operator also keeps one breaker for the Source
# (`SharedBreaker`, in the Source's status) and each campaign's pass adopts it (`adopted`):
#
# * Closed: it opens when any campaign's own breaker for it opened since it last closed, or when the
#   campaigns' streaks of rate-limited failures add up to the Source's threshold (a streak is a
#   campaign's own run of 429s without a success, so the sum counts each 429 once, in no order across
#   campaigns: it opens no later than one counter of all the calls would);
# * Open: every campaign adopts it, so no campaign claims its shards (they use their fallbacks). When
#   the cooldown has passed, one campaign (the prober: the first active one in serving order) turns
#   HalfOpen and its planner lets exactly one probe through; the others stay Open one more cooldown,
#   so the cluster makes one probe per cooldown. A probe that fails re-opens the prober's own breaker
#   at its failure: the Source's cooldown starts again from there. A probe that succeeds closes the
#   prober's breaker, and the Source closes, and with it every campaign's.


@dataclass(frozen=True)
class SharedBreaker:
    """A shared Source's breaker: open since `opened_at`, or closed since `closed_at` (None: never
    opened, or before this was recorded)."""

    state: BreakerState
    opened_at: datetime | None = None
    closed_at: datetime | None = None
    consecutive_rate_limited: int = 0


CLOSED_SHARED = SharedBreaker(BreakerState.CLOSED)


def shared_state(
    source: SharedBreaker,
    campaigns: Mapping[str, SourceBreaker],
    asked: Mapping[str, datetime],
    holding: Set[str],
    policy: BreakerPolicy,
    now: datetime,
) -> SharedBreaker:
    """The Source's breaker after seeing each campaign's breaker for it as its status holds it.
    `asked`: the openedAt the operator asked each campaign to hold while the Source is open;
    `holding`: the campaigns seen holding it since (both lost with a restart, which at worst costs a
    cooldown and one more probe)."""
    if source.state is BreakerState.CLOSED:
        fresh = [
            b.opened_at
            for b in campaigns.values()
            if b.state is not BreakerState.CLOSED
            and b.opened_at is not None
            and (source.closed_at is None or b.opened_at > source.closed_at)
        ]
        if fresh:
            return SharedBreaker(BreakerState.OPEN, max(fresh), None, policy.threshold)
        streak = sum(b.consecutive_rate_limited for b in campaigns.values() if b.state is BreakerState.CLOSED)
        if streak >= policy.threshold:
            return SharedBreaker(BreakerState.OPEN, now, None, streak)
        return replace(source, consecutive_rate_limited=streak)
    assert source.opened_at is not None
    if any(campaigns[c].state is BreakerState.CLOSED for c in holding if c in campaigns):
        # A campaign that held the Source's open breaker closed its own: its probe succeeded.
        return SharedBreaker(BreakerState.CLOSED, None, now, 0)
    failed = [
        b.opened_at
        for c, b in campaigns.items()
        if b.state is not BreakerState.CLOSED
        and b.opened_at is not None
        and b.opened_at > max(asked.get(c, source.opened_at), source.opened_at)
    ]
    if failed:
        # A probe (or a call begun before) was rate limited again: the cooldown starts from it.
        return replace(source, opened_at=max(failed))
    return source


def adopted(
    own: SourceBreaker,
    source: SharedBreaker,
    policy: BreakerPolicy,
    own_cooldown: timedelta,
    prober: bool,
) -> tuple[SourceBreaker, datetime | None]:
    """A campaign's breaker for a shared Source given the Source's (see above), and the openedAt it
    is asked to hold (None: the Source is closed). The campaign's planner turns a breaker HalfOpen
    at openedAt + `own_cooldown` (its own source's cooldownSeconds), so the value asked is shifted
    to make that the Source's moment: the prober's after one cooldown of the Source, the others'
    after two."""
    if source.state is BreakerState.CLOSED:
        stale = own.state is not BreakerState.CLOSED and (
            own.opened_at is None or source.closed_at is None or own.opened_at <= source.closed_at
        )
        return (CLOSED_BREAKER if stale else own), None
    assert source.opened_at is not None
    cooldowns = 1 if prober else 2
    asked = source.opened_at + cooldowns * policy.cooldown - own_cooldown
    # A failure is news only when it is newer than both the Source's opening and the value asked: with
    # an own cooldown longer than the Source's, what is asked lies before the opening, and the failure
    # that opened the Source (or that a failed probe re-opened it at, once the Source follows) is not
    # newer; kept as its own it would hold the campaign open for its own, longer cooldown.
    if (
        own.state is not BreakerState.CLOSED
        and own.opened_at is not None
        and own.opened_at > max(asked, source.opened_at)
    ):
        return own, asked  # its own failure, newer: the Source follows it (shared_state)
    return SourceBreaker(BreakerState.OPEN, max(own.consecutive_rate_limited, policy.threshold), asked), asked


def holds(own: SourceBreaker, asked: datetime | None) -> bool:
    """Whether a campaign's breaker, as its status holds it, is the Source's open one it was asked to
    hold (or its own newer failure)."""
    return (
        asked is not None
        and own.state is not BreakerState.CLOSED
        and own.opened_at is not None
        and own.opened_at >= asked
    )
