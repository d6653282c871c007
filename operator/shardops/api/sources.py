"""The upstreams a campaign calls (sources with rate limits, breakers and fallbacks) and its retry timing."""

from __future__ import annotations

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from shardops.api import rules
from shardops.api.common import (
    DNS_SUBDOMAIN_MAX,
    DNS_SUBDOMAIN_PATTERN,
    SourceName,
    SpecModel,
    cel_rules,
)
from shardops.api.enums import SourceKind, StallPolicy

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


class BreakerSettings(SpecModel):
    """When a source's circuit breaker opens and how long it stays open: the one home of these fields
    and their defaults, for a campaign's own source and for a shared Source alike."""

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


class SourceRef(SpecModel):
    """A shared Source (of the campaign's namespace) or ClusterSource that holds this source's endpoint,
    key, limits and prices."""

    kind: SourceKind = Field(
        default=SourceKind.SOURCE,
        description="Source (in the campaign's namespace) or ClusterSource. Default Source.",
    )
    name: str = Field(
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the Source or ClusterSource.",
    )

    def describe(self, namespace: str) -> str:
        return (
            f"{self.kind} {namespace}/{self.name}"
            if self.kind is SourceKind.SOURCE
            else f"{self.kind} {self.name}"
        )


class Source(BreakerSettings):
    """An upstream the work depends on (an LLM API, a model, a site), with its own circuit breaker."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(rules.FALLBACK_NOT_SELF, rules.SOURCE_REF_OWNS_LIMITS)
    )

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
    rate_limit: RateLimit | None = Field(
        default=None,
        description=(
            "Requests and tokens per minute for this source across all the campaign's workers; the "
            "built-in LLM worker paces itself to its share, limit / maxConcurrency. Not with sourceRef. "
            "Default: no limit."
        ),
    )
    source_ref: SourceRef | None = Field(
        default=None,
        description=(
            "A shared Source or ClusterSource whose limits every campaign naming it shares: the operator "
            "gives this campaign a part of them in proportion to weight (status.sourceShares). "
            "Default: none, the campaign's own rateLimit."
        ),
    )
    weight: int = Field(
        default=1,
        ge=1,
        le=1000,
        description=(
            "This campaign's weight on a shared Source: active campaigns get its requests and tokens per "
            "minute in proportion to their weights (higher spec.priority first when it is scarce). Default 1."
        ),
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Source:
        problems: list[str] = []
        if self.fallback is not None and self.fallback == self.name:
            problems.append(rules.FALLBACK_NOT_SELF.message)
        if self.source_ref is not None and self.rate_limit is not None:
            problems.append(rules.SOURCE_REF_OWNS_LIMITS.message)
        if problems:
            raise ValueError("; ".join(problems))
        return self
