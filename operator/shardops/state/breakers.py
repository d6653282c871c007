"""Per-source breakers: as the Campaign status records them, and as the planner takes them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from shardops.api.campaign import CampaignSpec, CampaignStatus
from shardops.api.enums import BreakerState
from shardops.api.sources import Source
from shardops.logic.breaker import BreakerPolicy, SourceBreaker
from shardops.logic.planner import Breakers


def breakers_from_status(status: CampaignStatus) -> dict[str, SourceBreaker]:
    """The breakers as last written. HalfOpen is derived from the clock, so it is stored back as Open."""
    states: dict[str, SourceBreaker] = {}
    for b in status.breakers:
        state = BreakerState.CLOSED if b.state is BreakerState.CLOSED else BreakerState.OPEN
        opened = b.opened_at if state is BreakerState.OPEN else None
        states[b.source] = SourceBreaker(state, b.consecutive_failures, opened)
    return states


def _policy(source: Source) -> BreakerPolicy:
    return BreakerPolicy(source.breaker_threshold, dt.timedelta(seconds=source.cooldown_seconds))


# A source that shards name but spec.sources does not declare gets the defaults of `Source`'s fields
# (model_construct applies them without validating the name), so the defaults live in the API only.
UNDECLARED_SOURCE_POLICY = _policy(Source.model_construct(name=""))


def breaker_policies(spec: CampaignSpec) -> dict[str, BreakerPolicy]:
    """Each declared source's breaker threshold and cooldown."""
    return {s.name: _policy(s) for s in spec.sources or []}


def breaker_policy(spec: CampaignSpec, source: str) -> BreakerPolicy:
    declared = spec.source(source)
    return _policy(declared) if declared is not None else UNDECLARED_SOURCE_POLICY


def cooldown_of(spec: CampaignSpec, source: str) -> dt.timedelta:
    return breaker_policy(spec, source).cooldown


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
