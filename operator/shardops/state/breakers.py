"""Per-source breakers: as the Campaign status records them, and as the planner takes them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from shardops.api.campaign import CampaignSpec, CampaignStatus
from shardops.api.enums import BreakerState
from shardops.logic.breaker import SourceBreaker
from shardops.logic.planner import Breakers


def breakers_from_status(status: CampaignStatus) -> dict[str, SourceBreaker]:
    """The breakers as last written. HalfOpen is derived from the clock, so it is stored back as Open."""
    states: dict[str, SourceBreaker] = {}
    for b in status.breakers:
        state = BreakerState.CLOSED if b.state is BreakerState.CLOSED else BreakerState.OPEN
        opened = b.opened_at if state is BreakerState.OPEN else None
        states[b.source] = SourceBreaker(state, b.consecutive_failures, opened)
    return states


def cooldown_of(spec: CampaignSpec, source: str) -> dt.timedelta:
    declared = spec.source(source)
    seconds = declared.cooldown_seconds if declared is not None else _DEFAULT_COOLDOWN_SECONDS
    return dt.timedelta(seconds=seconds)


_DEFAULT_COOLDOWN_SECONDS = 300


def planner_breakers(spec: CampaignSpec, states: Mapping[str, SourceBreaker]) -> Breakers:
    """The planner takes one cooldown for all sources; each source's own cooldown is expressed by
    moving its openedAt forward by that cooldown and giving the planner zero. `effective` then turns
    HalfOpen exactly when openedAt + the source's cooldown has passed, and skip reasons print that time."""
    shifted = {
        source: (
            SourceBreaker(b.state, b.consecutive_rate_limited, b.opened_at + cooldown_of(spec, source))
            if b.opened_at is not None
            else b
        )
        for source, b in states.items()
    }
    fallbacks = {s.name: s.fallback for s in spec.sources or [] if s.fallback}
    return Breakers(shifted, fallbacks, dt.timedelta(0))
