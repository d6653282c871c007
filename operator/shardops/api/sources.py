"""The upstreams a campaign calls (sources with rate limits, breakers and fallbacks) and its retry timing."""

from __future__ import annotations

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from shardops.api import rules
from shardops.api.common import (
    SourceName,
    SpecModel,
    cel_rules,
)
from shardops.api.enums import StallPolicy

MAX_SOURCES = 32

BREAKER_REASON_MAX = 1024


class Backoff(SpecModel):
    """Delay before a retryable failure is retried: min(base * 2^(attempt-1), cap), with jitter."""

    model_config = ConfigDict(json_schema_extra=cel_rules(rules.BACKOFF_BASE_WITHIN_CAP))

    base_seconds: float = Field(
        default=2,
        gt=0,
        le=3600,
        description=(
            "Delay after the first failed attempt, in seconds; doubles with every further attempt. Default 2."
        ),
    )
    cap_seconds: float = Field(
        default=120,
        gt=0,
        le=86400,
        description="Longest delay between attempts, in seconds. Default 120.",
    )

    @model_validator(mode="after")
    def _base_within_cap(self) -> Backoff:
        if self.base_seconds > self.cap_seconds:
            raise ValueError(rules.BACKOFF_BASE_WITHIN_CAP.message)
        return self


class Stall(SpecModel):
    """When a running shard that keeps heartbeating without progress counts as stuck."""

    policy: StallPolicy = Field(
        default=StallPolicy.REPORT,
        description=(
            "What to do with a stuck shard: Report raises an event and the Stalled condition and lets "
            "it run; Revoke also takes its lease away so another worker retries it (attempt+1). "
            "Default Report."
        ),
    )
    heartbeats: int = Field(
        default=2,
        ge=1,
        le=100,
        description="Consecutive heartbeats without progress after which a shard is stuck. Default 2.",
    )


class RateLimit(SpecModel):
    """How much of a source all of the campaign's workers together may use per minute."""

    requests_per_minute: float | None = Field(
        default=None, gt=0, description="Requests per minute across all workers. Default: no limit."
    )
    tokens_per_minute: float | None = Field(
        default=None,
        gt=0,
        description="Tokens (prompt + completion) per minute across all workers. Default: no limit.",
    )


class Source(SpecModel):
    """An upstream the work depends on (an LLM API, a model, a site), with its own circuit breaker."""

    model_config = ConfigDict(json_schema_extra=cel_rules(rules.FALLBACK_NOT_SELF))

    name: SourceName = Field(
        description="Name that items and shards refer to; letters, digits, '-', '_' and '.', at most 63."
    )
    fallback: SourceName | None = Field(
        default=None,
        description=(
            "Another declared source to use while this one's breaker is open. Default: none, shards of this "
            "source wait for the cooldown."
        ),
    )
    breaker_threshold: int = Field(
        default=3,
        ge=1,
        le=100,
        description=(
            "Consecutive rate-limited failures of this source that open its breaker and stop claiming "
            "its shards. Default 3."
        ),
    )
    cooldown_seconds: int = Field(
        default=300,
        ge=1,
        le=86400,
        description=(
            "Seconds an open breaker waits before letting one trial shard through (half-open). Default 300."
        ),
    )
    rate_limit: RateLimit | None = Field(
        default=None,
        description=(
            "Requests and tokens per minute for this source across all the campaign's workers; the "
            "built-in LLM worker paces itself to its share, limit / maxConcurrency. Default: no limit."
        ),
    )

    @model_validator(mode="after")
    def _fallback_not_self(self) -> Source:
        if self.fallback is not None and self.fallback == self.name:
            raise ValueError(rules.FALLBACK_NOT_SELF.message)
        return self
