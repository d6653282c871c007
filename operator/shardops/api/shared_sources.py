"""Source and ClusterSource: one upstream (endpoint, key, model, limits, prices, breaker) shared by every
campaign that names it in `spec.sources[].sourceRef`.

The split is cert-manager's Issuer/ClusterIssuer: a `Source` lives in a namespace and serves that
namespace's campaigns, with its key Secret beside it; a `ClusterSource` is cluster-scoped, its key
Secret lives in the operator's namespace, and it serves only the namespaces it lists
(docs/security.md says what that exposes). The operator hands every active campaign on a Source a
weighted share of its limits (`status.shares`, and each campaign's own `status.sourceShares`, which
its workers read), so all of them together stay within the Source's requests and tokens per minute.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AwareDatetime, BeforeValidator, Field

from shardops.api.common import (
    DNS_SUBDOMAIN_MAX,
    Condition,
    ResourceModel,
    StatusModel,
    keeping_first,
    keyed_list,
)
from shardops.api.enums import BreakerState
from shardops.api.llm import MODEL_NAME_MAX, URL_MAX, SecretKeyRef, TokenPrice
from shardops.api.names import CLUSTER_SOURCE_KIND, DNS_LABEL_MAX, SOURCE_KIND
from shardops.api.sources import BreakerSettings, RateLimit

# The campaigns listed in a Source's status.shares (each share is also in its campaign's own status,
# which is what the workers obey): beyond this the list keeps the first ones, the totals stay whole.
MAX_LISTED_SHARES = 100
# Namespaces a ClusterSource may name; "*" stands for all.
MAX_ALLOWED_NAMESPACES = 256
ALL_NAMESPACES = "*"
# "namespace/name" of a campaign.
CAMPAIGN_KEY_MAX = DNS_LABEL_MAX + 1 + DNS_SUBDOMAIN_MAX


class SourceLimits(RateLimit):
    """How much of the upstream every campaign that uses this Source may use together, per minute."""

    input_tokens_per_minute: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Prompt tokens per minute, for a provider that limits them apart (shared out and paced like "
            "tokensPerMinute). Default: no limit."
        ),
    )
    output_tokens_per_minute: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Completion tokens per minute, for a provider that limits them apart (shared out and paced "
            "like tokensPerMinute). Default: no limit."
        ),
    )


class SharedSourceSpec(BreakerSettings):
    """One upstream account: where requests go, with which key, and how much of it may be used."""

    base_url: str = Field(
        max_length=URL_MAX,
        pattern=r"^https?://",
        description=(
            "Base URL of the OpenAI-compatible API, up to and including the version "
            "(https://api.openai.com/v1); requests go to <baseUrl>/chat/completions. Required."
        ),
    )
    model: str = Field(
        min_length=1,
        max_length=MODEL_NAME_MAX,
        description="Model (or a proxy's route) sent in requests. Required.",
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description=(
            "The Secret whose key holds the API key: in the Source's namespace for a Source, in the "
            "operator's namespace for a ClusterSource. Default: no key (local servers)."
        ),
    )
    rate_limit: SourceLimits | None = Field(
        default=None,
        description=(
            "Requests and tokens per minute for every campaign and worker together; the operator gives "
            "each active campaign a share in proportion to its weight. Default: no limit."
        ),
    )
    price: TokenPrice | None = Field(
        default=None,
        description="What the model's tokens cost, so budgets are in money. Default: cost counted in tokens.",
    )


class ClusterSourceSpec(SharedSourceSpec):
    """A Source for campaigns of the namespaces it lists."""

    namespaces: list[Annotated[str, Field(min_length=1, max_length=DNS_LABEL_MAX)]] = Field(
        default_factory=list,
        max_length=MAX_ALLOWED_NAMESPACES,
        description=(
            "Namespaces whose campaigns may use this ClusterSource (and so its key, through their "
            "workers); '*' for every namespace. Default none: nobody may use it until listed."
        ),
    )

    def serves(self, namespace: str) -> bool:
        return ALL_NAMESPACES in self.namespaces or namespace in self.namespaces


class CampaignShare(StatusModel):
    """What one active campaign may use of the Source, per minute, across all its workers."""

    campaign: str = Field(max_length=CAMPAIGN_KEY_MAX, description="namespace/name of the campaign.")
    weight: int = Field(ge=1, description="Its weight (spec.sources[].weight).")
    priority: int = Field(default=0, description="Its spec.priority.")
    requests_per_minute: float | None = Field(
        default=None,
        ge=0,
        description="Its share of requestsPerMinute; none when the Source has no such limit.",
    )
    tokens_per_minute: float | None = Field(
        default=None,
        ge=0,
        description="Its share of tokensPerMinute; none when the Source has no such limit.",
    )
    input_tokens_per_minute: float | None = Field(
        default=None,
        ge=0,
        description="Its share of inputTokensPerMinute; none when the Source has no such limit.",
    )
    output_tokens_per_minute: float | None = Field(
        default=None,
        ge=0,
        description="Its share of outputTokensPerMinute; none when the Source has no such limit.",
    )


class SourceBreakerStatus(StatusModel):
    """The Source's one circuit breaker, for every campaign that uses it."""

    state: BreakerState = Field(default=BreakerState.CLOSED, description="Closed, Open or HalfOpen.")
    consecutive_failures: int = Field(default=0, ge=0, description="Rate-limited failures in a row.")
    opened_at: AwareDatetime | None = Field(default=None, description="When it last opened.")
    closed_at: AwareDatetime | None = Field(default=None, description="When it last closed.")


class SharedSourceStatus(StatusModel):
    """How the Source's limits are shared out now."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status was computed from."
    )
    campaigns: int = Field(default=0, ge=0, description="Active campaigns holding a share.")
    granted_requests_per_minute: float | None = Field(
        default=None, ge=0, description="Requests per minute handed out in shares (at most the limit)."
    )
    granted_tokens_per_minute: float | None = Field(
        default=None, ge=0, description="Tokens per minute handed out in shares (at most the limit)."
    )
    granted_input_tokens_per_minute: float | None = Field(
        default=None,
        ge=0,
        description="Prompt tokens per minute handed out in shares (at most the limit).",
    )
    granted_output_tokens_per_minute: float | None = Field(
        default=None,
        ge=0,
        description="Completion tokens per minute handed out in shares (at most the limit).",
    )
    lowered_at: AwareDatetime | None = Field(
        default=None,
        description=(
            "When a share of it was last lowered or taken away: no share grows until that is in force "
            "at the workers, also after the operator restarts."
        ),
    )
    shares: Annotated[list[CampaignShare], BeforeValidator(keeping_first(MAX_LISTED_SHARES))] = Field(
        default_factory=list,
        max_length=MAX_LISTED_SHARES,
        description=f"Each active campaign's share (the first {MAX_LISTED_SHARES}).",
    )
    breaker: SourceBreakerStatus = Field(
        default_factory=SourceBreakerStatus, description="The Source's circuit breaker."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra=keyed_list("type"),
        description="Latest observations, for example Ready (the key Secret and the limits are usable).",
    )


class SharedSource(ResourceModel):
    """A Source: one upstream (endpoint, API key, model, limits, prices, breaker) shared by the campaigns
    of its namespace that name it in spec.sources[].sourceRef."""

    KIND = SOURCE_KIND

    kind: str = Field(default=SOURCE_KIND, description="Always Source.")
    spec: SharedSourceSpec = Field(description="The upstream and its limits.")
    status: SharedSourceStatus | None = Field(default=None, description="Observed state.")


class ClusterSharedSource(ResourceModel):
    """A ClusterSource: a Source for every namespace it lists, its key Secret in the operator's namespace."""

    KIND = CLUSTER_SOURCE_KIND

    kind: str = Field(default=CLUSTER_SOURCE_KIND, description="Always ClusterSource.")
    spec: ClusterSourceSpec = Field(description="The upstream, its limits and the namespaces it serves.")
    status: SharedSourceStatus | None = Field(default=None, description="Observed state.")
