"""A process's wall clock (`utcnow`), and that clock shifted on purpose: fault injection of clock skew.

The operator and the worker read their wall clock (`now`: claim and heartbeat times, leaseUntil,
notBefore, history entries, Event times) through `ClockSkewSettings.wall_clock`. The fault suite sets
SHARDOPS_CLOCK_OFFSET_SECONDS (and a per-process random spread) to play a machine whose clock is off;
nothing else should. The monotonic clock is never shifted: a skewed machine's clock still ticks at
the same rate, and every judgement of expiry is made on it (`logic.leases`, "Whose clock").
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable

from pydantic import Field
from pydantic_settings import BaseSettings

# As far as anyone would play a clock off: a day either way.
_MOST_SKEW_SECONDS = 86_400.0


class ClockSkewSettings(BaseSettings):
    """Two settings both processes share (env prefix SHARDOPS_, as the classes that inherit them)."""

    clock_offset_seconds: float = Field(
        default=0.0,
        ge=-_MOST_SKEW_SECONDS,
        le=_MOST_SKEW_SECONDS,
        description=(
            "Fault injection only: shift this process's wall clock by this many seconds (a machine "
            "whose clock is off). Leave 0 in production."
        ),
    )
    clock_offset_spread_seconds: float = Field(
        default=0.0,
        ge=0,
        le=_MOST_SKEW_SECONDS,
        description=(
            "Fault injection only: add a random offset in ±this many seconds, drawn once per process, "
            "so the workers of one campaign disagree with each other too."
        ),
    )

    def wall_clock(self, rng: random.Random | None = None) -> Callable[[], dt.datetime]:
        """`now` in UTC, shifted by the configured offset (drawn once, here)."""
        spread = self.clock_offset_spread_seconds
        offset = self.clock_offset_seconds + (
            (rng or random.Random()).uniform(-spread, spread) if spread else 0.0
        )
        if not offset:
            return utcnow
        shift = dt.timedelta(seconds=offset)
        return lambda: utcnow() + shift


def utcnow() -> dt.datetime:
    """The wall clock in UTC, unshifted: the one `now` every process reads unless a test hands it another."""
    return dt.datetime.now(dt.UTC)
