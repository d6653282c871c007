"""Exponential backoff with jitter: delay = min(base·2^(attempt-1), cap) · (0.5 + rand·0.5)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

# 2.0**1000 is finite, and base·2**1000 saturates to inf rather than raising, so min(..., cap) stays cap.
_MAX_EXPONENT = 1000
# A Retry-After of r seconds sends the shard back after r to r·(1 + this).
RETRY_AFTER_JITTER = 0.2


def backoff_ceiling(attempt: int, base: float, cap: float) -> float:
    """The un-jittered delay for the attempt that just failed: min(base·2^(attempt-1), cap)."""
    _check(attempt, base, cap)
    exponent = min(attempt - 1, _MAX_EXPONENT)
    return float(min(base * 2.0**exponent, cap))


def backoff_bounds(attempt: int, base: float, cap: float) -> tuple[float, float]:
    """[lowest, highest] delay the jitter can produce; half the ceiling keeps retries spread out."""
    ceiling = backoff_ceiling(attempt, base, cap)
    return ceiling * 0.5, ceiling


def backoff_delay(attempt: int, base: float, cap: float, rand: float) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based); `rand` is the injected draw in [0, 1)."""
    if not 0.0 <= rand < 1.0:
        raise ValueError(f"rand must be in [0, 1), got {rand}")
    return backoff_ceiling(attempt, base, cap) * (0.5 + rand * 0.5)


def retry_not_before(
    now: datetime, attempt: int, base: float, cap: float, rand: float, retry_after: float | None = None
) -> datetime:
    """The earliest time the shard may be claimed again (the Shard's notBefore).

    `retry_after`: seconds the upstream asked for (Retry-After): never sooner than that, and up to
    RETRY_AFTER_JITTER later, so the shards one 429 wave sent back do not all return at one instant.
    """
    delay = backoff_delay(attempt, base, cap, rand)
    if retry_after is not None:
        delay = max(delay, retry_after * (1.0 + rand * RETRY_AFTER_JITTER))
    return now + timedelta(seconds=delay)


def _check(attempt: int, base: float, cap: float) -> None:
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    if not (base > 0 and cap > 0 and math.isfinite(base) and math.isfinite(cap)):
        raise ValueError(f"base and cap must be positive and finite, got base={base} cap={cap}")
