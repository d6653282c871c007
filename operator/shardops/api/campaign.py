"""The Campaign resource: a body of work, how to run it, and how it is going.

The defaults in this module are the only ones: the CRD's `default:` values are generated from
them, and the operator parses every object through these models.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    computed_field,
    model_validator,
)

from shardops.api import rules
from shardops.api.common import (
    DNS_SUBDOMAIN_MAX,
    SOURCE_NAME_MAX,
    Condition,
    Item,
    Money,
    ResourceModel,
    SourceName,
    SpecModel,
    StatusModel,
    TokenCounts,
    cel_rules,
    find_condition,
    keeping_first,
    keyed_list,
    schema_default,
    set_condition,
    truncating,
    without_inline_items,
)
from shardops.api.enums import BreakerState, CampaignPhase
from shardops.api.folded import MAX_ERROR_WINDOW, FoldedShards
from shardops.api.items import ITEM_SOURCE_SCHEMA, MAX_INLINE_ITEMS, ItemsFrom, ItemsPin
from shardops.api.llm import CONFIG_ENV, MODEL_NAME_MAX, URL_MAX, SecretKeyRef, TokenPrice
from shardops.api.names import CAMPAIGN_KIND
from shardops.api.sources import BREAKER_REASON_MAX, MAX_SOURCES, Backoff, Source, Stall
from shardops.api.store import ResultStoreSpec, ResultStoreStatus
from shardops.api.worker import ItemsWorkerSpec, WorkerSpec

# Bounds the lists of shard names in the status; the counts carry the full numbers.
MAX_LISTED_SHARDS = 50


class Budget(SpecModel):
    """A spending cap in the unit the command reports cost in (for example USD or tokens)."""

    limit: Money = Field(
        gt=0,
        description=(
            "Total cost the campaign may spend. With maxPerShard a work shard starts only while spent, plus "
            "what the running shards may still spend (maxPerShard less their cost), plus its own "
            "maxPerShard stays within limit; without it nothing bounds what the shards running at the warn "
            "ratio spend. At the limit unclaimed shards are Paused and running ones finish; that is not a "
            "failure. Work the budget holds back (condition BudgetHeld) starts again when limit is raised. "
            "Required."
        ),
    )
    warn_ratio: float = Field(
        default=0.8,
        gt=0,
        lt=1,
        description=(
            "Fraction of limit (between 0 and 1, exclusive) from which only finalize shards start and "
            "the BudgetWarning condition is set. Default 0.8."
        ),
    )
    max_per_shard: Money | None = Field(
        default=None,
        description=(
            "Cost one shard may spend over all its attempts; a shard that exceeds it fails with class "
            "over-budget. Each work shard reserves it of limit when it starts, which keeps the campaign's "
            "spend within limit. At most limit. Default: no per-shard cap (and no reservation)."
        ),
    )

    @model_validator(mode="after")
    def _per_shard_within_limit(self) -> Budget:
        # Checked here, not by CEL: the API server's CEL cannot see an untyped (number or string) field.
        if self.max_per_shard is not None and self.max_per_shard <= 0:
            raise ValueError("spec.budget.maxPerShard must be greater than 0; remove it for no per-shard cap")
        if self.max_per_shard is not None and self.max_per_shard > self.limit:
            raise ValueError(rules.BUDGET_PER_SHARD_WITHIN_LIMIT)
        return self


class ErrorThreshold(SpecModel):
    """When the campaign stops claiming because its attempts keep failing for good (a broken
    template, a revoked key), instead of spending shard after shard on the same mistake."""

    consecutive: int = Field(
        default=5,
        ge=0,
        le=10000,
        description=(
            "Non-retryable failures in a row (no shard Done between them) that hold the campaign; "
            "0 turns this rule off. Default 5."
        ),
    )
    ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description=(
            "Share of the last window attempts that failed non-retryably above which the campaign is "
            "held; 1 turns this rule off. Default 0.5."
        ),
    )
    window: int = Field(
        default=20,
        ge=1,
        le=MAX_ERROR_WINDOW,
        description="Latest attempts the ratio is taken over (it waits for that many). Default 20.",
    )


MAX_RETRY_SHARDS = 1000


class RetryRequest(SpecModel):
    """A recorded request to retry the shards that gave up."""

    generation: int = Field(
        default=0,
        ge=0,
        description=(
            "Increase by one to retry the Blocked and Failed shards (all of them, or those in shards) "
            "once, with their attempts reset. The operator acts once per value and records it in "
            "status.lastRetryGeneration. Default 0."
        ),
    )
    shards: list[Annotated[str, Field(min_length=1, max_length=DNS_SUBDOMAIN_MAX)]] | None = Field(
        default=None,
        max_length=MAX_RETRY_SHARDS,
        description=(
            "Names of the Blocked/Failed shards to retry with this generation; unset or empty: all of "
            "them. A listed shard that is not Blocked or Failed is skipped (the operator's event says so). "
            "Written by kubectl campaign retry --shard/--blocked/--failed together with the generation."
        ),
    )
    errored: bool | None = Field(
        default=None,
        description=(
            "With this generation, run again the items of Done shards that errored on their own "
            "(status.itemsErrored) instead of retrying the gave-up shards: each such shard, live or "
            "folded, runs just its errored items (same keys) and keeps its other items' results. "
            "Written by kubectl campaign retry --errored."
        ),
    )


class CampaignSpec(SpecModel):
    """What to process and how: items, the worker command, concurrency, leases, retries, sources, budget."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            rules.ITEMS_XOR_ITEMS_FROM,
            rules.HEARTBEAT_UNDER_HALF_LEASE,
            rules.SOURCE_NAMES_UNIQUE,
            rules.FALLBACK_DECLARED,
            rules.DEFAULT_SOURCE_DECLARED,
            rules.LLM_ENDPOINTS_DECLARED,
            *rules.IMMUTABLE_CAMPAIGN_INPUTS.values(),
        )
    )

    items: list[Item] | None = Field(
        default=None,
        max_length=MAX_INLINE_ITEMS,
        # The API server refuses an item whose source no Shard could carry, at admission.
        json_schema_extra={
            "items": {
                "type": "object",
                "additionalProperties": True,
                "properties": {
                    "source": {
                        **ITEM_SOURCE_SCHEMA,
                        "description": "The source this item calls (a name in spec.sources). Default: "
                        "spec.defaultSource.",
                    }
                },
            }
        },
        description=(
            "The work, inline: one JSON object per unit of work, passed to the command as is; an "
            "item's optional `source` key picks its source. "
            f"At most {MAX_INLINE_ITEMS}; use itemsFrom for more. Set exactly one of items and itemsFrom."
        ),
    )
    items_from: ItemsFrom | None = Field(
        default=None,
        description="The work, from a ConfigMap key holding JSONL. Set exactly one of items and itemsFrom.",
    )
    shard_size: int = Field(
        default=10,
        ge=1,
        description="Items per shard; one shard is one claim and one run of the command. Default 10.",
    )
    worker: ItemsWorkerSpec = Field(
        description="The command that processes a shard's items, and its pod. Required."
    )
    finalize: WorkerSpec | None = Field(
        default=None,
        description=(
            "A closing step (merge, validate, report) run once after every work shard is Done, Failed "
            "or Blocked. Default: none."
        ),
    )
    max_concurrency: int = Field(
        default=6,
        ge=1,
        le=1000,
        description="Most shards running, and worker pods alive, at any time. Default 6.",
    )
    backlog_ratio: int = Field(
        default=5,
        ge=1,
        description=(
            "More shards are made claimable only while Pending <= backlogRatio * max(Running, 1). Default 5."
        ),
    )
    lease_seconds: int = Field(
        default=120,
        ge=10,
        le=3600,
        description=(
            "How long a claim lasts without a heartbeat, in seconds. An expired lease makes the shard "
            "claimable again with attempt+1. Default 120."
        ),
    )
    heartbeat_seconds: int | None = Field(
        default=None,
        ge=1,
        le=1800,
        description=(
            "Seconds between worker heartbeats (which renew the lease and report progress). Must be "
            "less than half of leaseSeconds. Default leaseSeconds/3."
        ),
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Attempts per shard; after the last retryable failure the shard is Blocked. Default 3.",
    )
    backoff: Backoff = Field(
        default_factory=Backoff,
        json_schema_extra=schema_default(Backoff),
        description="Delay before retrying a retryable failure. Default base 2s, cap 120s.",
    )
    stall: Stall = Field(
        default_factory=Stall,
        json_schema_extra=schema_default(Stall),
        description=(
            "When a shard without progress is stuck, and what happens "
            "then. Default: report after 2 heartbeats."
        ),
    )
    sources: list[Source] | None = Field(
        default=None,
        max_length=MAX_SOURCES,
        description=(
            f"Upstreams the work calls, each with a circuit breaker and an optional fallback. At most "
            f"{MAX_SOURCES}, names unique. Default none."
        ),
    )
    default_source: SourceName | None = Field(
        default=None,
        description="The source a shard uses when its items do not name one; must be declared in sources.",
    )
    budget: Budget | None = Field(default=None, description="Spending cap. Default: unlimited.")
    suspend: bool = Field(
        default=False,
        description="true stops claiming new shards (running ones finish); false resumes. Default false.",
    )
    priority: int = Field(
        default=0,
        ge=-1000000,
        le=1000000,
        description="Higher-priority campaigns' shards are dispatched first when workers compete. Default 0.",
    )
    retry: RetryRequest = Field(
        default_factory=RetryRequest,
        json_schema_extra=schema_default(RetryRequest),
        description="Bump retry.generation to retry Blocked and Failed shards once.",
    )
    error_threshold: ErrorThreshold = Field(
        default_factory=ErrorThreshold,
        json_schema_extra=schema_default(ErrorThreshold),
        description=(
            "When too many attempts fail non-retryably, stop claiming (condition ErrorThreshold, phase "
            "Suspended) until a person runs kubectl campaign resume. Default 5 in a row, or more than "
            "half of the last 20."
        ),
    )
    idle_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="Seconds a worker waits for a claimable shard before it exits. Default 30.",
    )
    result_store: ResultStoreSpec | None = Field(
        default=None,
        description="Where results are kept. Default: the installation's result store.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=365 * 24 * 3600,
        description=(
            "Seconds after the campaign finished (Succeeded or Completed) when the operator deletes "
            "it, with its Shards and worker Jobs; stored results stay (they follow their own "
            "retention). Default: kept until deleted."
        ),
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> CampaignSpec:
        # All violations at once, so a user fixes a manifest in one round trip.
        problems: list[str] = []
        if (self.items is None) == (self.items_from is None):
            problems.append(rules.ITEMS_XOR_ITEMS_FROM.message)
        if self.heartbeat_seconds is not None and self.heartbeat_seconds * 2 >= self.lease_seconds:
            problems.append(rules.HEARTBEAT_UNDER_HALF_LEASE.message)
        names = self.source_names
        if len(set(names)) != len(names):
            duplicates = sorted({name for name in names if names.count(name) > 1})
            problems.append(f"{rules.SOURCE_NAMES_UNIQUE.message} (duplicated: {', '.join(duplicates)})")
        undeclared = [s for s in self.sources or [] if s.fallback is not None and s.fallback not in names]
        if undeclared:
            detail = ", ".join(f"{s.name} -> {s.fallback}" for s in undeclared)
            problems.append(f"{rules.FALLBACK_DECLARED.message} ({detail})")
        if self.default_source is not None and self.default_source not in names:
            problems.append(f"{rules.DEFAULT_SOURCE_DECLARED.message} ({self.default_source})")
        llm_undeclared = [
            e.name for e in (self.worker.llm.sources if self.worker.llm else []) if e.name not in names
        ]
        if llm_undeclared:
            problems.append(f"{rules.LLM_ENDPOINTS_DECLARED.message} ({', '.join(llm_undeclared)})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def effective_heartbeat_seconds(self) -> float:
        """heartbeatSeconds, or leaseSeconds/3 when unset."""
        if self.heartbeat_seconds is not None:
            return float(self.heartbeat_seconds)
        return self.lease_seconds / 3

    @property
    def source_names(self) -> list[str]:
        """Names of the declared sources, in declaration order."""
        return [source.name for source in self.sources or []]

    def source(self, name: str) -> Source | None:
        """The declared source of that name, or None."""
        return next((s for s in self.sources or [] if s.name == name), None)

    def command_settings(self, worker: WorkerSpec, shares: Sequence[SourceShare] = ()) -> dict[str, str]:
        """Environment the worker runtime adds for `worker`'s command: the built-in LLM worker's
        settings (its block, the sources' rate limits, the sources paced by a shared Source's share,
        maxConcurrency for the per-worker share)."""
        if worker.llm is None:
            return {}
        llm = worker.llm.to_dict()
        for share in shares:
            # A shared Source's endpoint, model, key and price (the operator copied them into the
            # status): they win over the llm block's for that source.
            if share.base_url is None or share.model is None:
                continue
            endpoint: dict[str, Any] = {"name": share.source, "baseUrl": share.base_url, "model": share.model}
            if share.api_key_secret is not None:
                endpoint["apiKeySecret"] = share.api_key_secret.to_dict()
            llm["sources"] = [e for e in llm.get("sources", []) if e["name"] != share.source] + [endpoint]
            # Only into a price table the campaign has: without one its cost is counted in tokens,
            # and a table of one source would leave its other models unpriced.
            if share.price is not None and llm.get("prices"):
                prices = [p for p in llm.get("prices", []) if p.get("source") != share.source]
                llm["prices"] = [
                    *prices,
                    {"model": share.model, "source": share.source, **share.price.to_dict()},
                ]
        config = {
            "llm": llm,
            "maxConcurrency": self.max_concurrency,
            "rateLimits": {
                s.name: s.rate_limit.to_dict() for s in self.sources or [] if s.rate_limit is not None
            },
            # Their pace is the campaign's share of a Source (status.sourceShares), which the runtime
            # keeps in the shard's cooldown file: none there yet means no call yet.
            "sharedSources": [s.name for s in self.sources or [] if s.source_ref is not None],
        }
        return {CONFIG_ENV: json.dumps(config, separators=(",", ":"))}

    def expected_shards(self, items_total: int) -> int:
        """Number of work shards for `items_total` items (the finalize shard not included)."""
        return math.ceil(items_total / self.shard_size)

    @property
    def inline_items_total(self) -> int | None:
        """Number of inline items, or None when they come from itemsFrom."""
        if self._counted_items is not None:
            return self._counted_items
        return None if self.items is None else len(self.items)

    @property
    def items_left_out(self) -> bool:
        """True when parsed by `Campaign.parse_items_counted`: spec.items reads as [] and only
        `inline_items_total` is true to the object."""
        return self._counted_items is not None

    # Set only by Campaign.parse_items_counted.
    _counted_items: int | None = PrivateAttr(default=None)


class ShardCounts(StatusModel):
    """How many shards are in each phase."""

    queued: int = Field(
        default=0,
        ge=0,
        description=(
            "Shards not yet claimable because they are not yet cut from the items (or cut, not materialized)."
        ),
    )
    pending: int = Field(default=0, ge=0, description="Shards waiting to be claimed (includes backing off).")
    running: int = Field(default=0, ge=0, description="Shards claimed by a worker.")
    done: int = Field(default=0, ge=0, description="Shards finished successfully.")
    failed: int = Field(default=0, ge=0, description="Shards that hit a non-retryable error.")
    blocked: int = Field(default=0, ge=0, description="Shards that used up maxAttempts.")
    paused: int = Field(default=0, ge=0, description="Shards held back by the budget or by suspend.")
    total: int = Field(default=0, ge=0, description="Shards known so far, in any phase.")
    materialized: int = Field(default=0, ge=0, description="Shards that exist as Shard objects.")

    @property
    def terminal(self) -> int:
        """Done + Failed + Blocked."""
        return self.done + self.failed + self.blocked


class BreakerStatus(StatusModel):
    """The circuit breaker of one source."""

    source: str = Field(max_length=SOURCE_NAME_MAX, description="Name of the source.")
    state: BreakerState = Field(
        default=BreakerState.CLOSED,
        description=(
            "Closed: shards are claimed. Open: not claimed (fallback used if any). HalfOpen: one trial."
        ),
    )
    consecutive_failures: int = Field(
        default=0, ge=0, description="Rate-limited failures in a row; a success resets it."
    )
    opened_at: AwareDatetime | None = Field(default=None, description="When the breaker last opened.")
    reason: Annotated[str | None, BeforeValidator(truncating(BREAKER_REASON_MAX))] = Field(
        default=None,
        max_length=BREAKER_REASON_MAX,
        description="Why the breaker opened, from the last failure.",
    )


class SourceShare(StatusModel):
    """This campaign's share of a shared Source's limits, handed out by the operator: its workers
    together keep within it (each at share / maxConcurrency)."""

    source: str = Field(max_length=SOURCE_NAME_MAX, description="Name of the source in spec.sources.")
    requests_per_minute: float | None = Field(
        default=None, ge=0, description="Requests per minute; none when the Source has no such limit."
    )
    tokens_per_minute: float | None = Field(
        default=None, ge=0, description="Tokens per minute; none when the Source has no such limit."
    )
    input_tokens_per_minute: float | None = Field(
        default=None, ge=0, description="Prompt tokens per minute; none when the Source has no such limit."
    )
    output_tokens_per_minute: float | None = Field(
        default=None,
        ge=0,
        description="Completion tokens per minute; none when the Source has no such limit.",
    )
    base_url: str | None = Field(
        default=None, max_length=URL_MAX, description="The Source's baseUrl, which the worker calls."
    )
    model: str | None = Field(default=None, max_length=MODEL_NAME_MAX, description="The Source's model.")
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="The Source's key Secret (in this namespace), which the worker pods read the key from.",
    )
    price: TokenPrice | None = Field(default=None, description="The Source's price of its model's tokens.")
    lowered_at: AwareDatetime | None = Field(
        default=None,
        description=(
            "When the operator last lowered this share. No share on the Source grows until every "
            "lowering is that long past (a heartbeat interval and a margin), so it is in force first."
        ),
    )


class SourceCooldown(StatusModel):
    """A source that answered rate-limited with a wait (Retry-After): no worker calls it before `until`."""

    source: str = Field(max_length=SOURCE_NAME_MAX, description="Name of the source.")
    until: AwareDatetime = Field(description="When the source may be called again (RFC 3339).")
    shard: str | None = Field(
        default=None, max_length=DNS_SUBDOMAIN_MAX, description="The shard whose call was told to wait."
    )


ShardNames = Annotated[list[str], BeforeValidator(keeping_first(MAX_LISTED_SHARDS))]


class CampaignStatus(StatusModel):
    """How the campaign is going, written by the operator only."""

    phase: CampaignPhase | None = Field(default=None, description="Where the campaign is in its life.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status was computed from."
    )
    counts: ShardCounts = Field(default_factory=ShardCounts, description="Shards per phase.")
    items_total: int | None = Field(default=None, ge=0, description="Number of items, once they were read.")
    items_errored: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Items of Done shards that failed on their own (a 400 for that request, a template field it "
            "lacks, an answer off the schema), folded shards included; kubectl campaign results --failed "
            "lists them. Unset while none did."
        ),
    )
    shards_total: int | None = Field(
        default=None, ge=0, description="Expected number of work shards, once the items were read."
    )
    cut_shards: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Work shards cut from the items so far: shards are cut in index order, so this is the next "
            "index to cut. Workers read it instead of listing every shard."
        ),
    )
    spent: Money = Field(default=Decimal(0), description="Cost reported so far, in the budget's unit.")
    tokens: TokenCounts = Field(
        default_factory=TokenCounts,
        description=(
            "Tokens the shards reported using so far (folded shards included), by kind; never goes down."
        ),
    )
    budget_ratio: float | None = Field(
        default=None, ge=0, description="spent / budget.limit; absent without a budget."
    )
    breakers: list[BreakerStatus] = Field(
        default_factory=list,
        max_length=MAX_SOURCES,
        json_schema_extra=keyed_list("source"),
        description="Circuit breaker of each source that has one.",
    )
    source_shares: list[SourceShare] = Field(
        default_factory=list,
        max_length=MAX_SOURCES,
        json_schema_extra=keyed_list("source"),
        description=(
            "For each source that refers to a shared Source or ClusterSource: the part of its limits "
            "this campaign may use. A source listed with no share (0) is not called until it gets one."
        ),
    )
    source_cooldowns: list[SourceCooldown] = Field(
        default_factory=list,
        max_length=MAX_SOURCES,
        json_schema_extra=keyed_list("source"),
        description=(
            "Sources told to wait by a rate-limited answer (Retry-After) and not yet past it: workers "
            "claim none of their shards and running ones pause their calls to them until then."
        ),
    )
    oldest_pending_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Age in seconds of the longest-waiting Pending shard (starvation signal).",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra=keyed_list("type"),
        description="Latest observations of the campaign's state, for example Ready, Stalled, BudgetWarning.",
    )
    blocked_shards: ShardNames = Field(
        default_factory=list,
        max_length=MAX_LISTED_SHARDS,
        description=f"Names of Blocked shards, at most {MAX_LISTED_SHARDS}; counts.blocked has the total.",
    )
    failed_shards: ShardNames = Field(
        default_factory=list,
        max_length=MAX_LISTED_SHARDS,
        description=f"Names of Failed shards, at most {MAX_LISTED_SHARDS}; counts.failed has the total.",
    )
    last_retry_generation: int = Field(
        default=0, ge=0, description="The spec.retry.generation the operator last acted on."
    )
    folded: FoldedShards = Field(
        default_factory=FoldedShards,
        description=(
            "Shards already written to the ledger and deleted, Done, Failed and Blocked ones (counted "
            "in counts)."
        ),
    )
    items_pin: ItemsPin | None = Field(
        default=None,
        description=(
            "What spec.itemsFrom held when first read, recorded before the first shard is cut: content "
            "changed after that is refused. Unset for inline items."
        ),
    )
    result_store: ResultStoreStatus | None = Field(
        default=None,
        description=(
            "The result store this campaign uses, recorded before its first shard is cut. Unset on "
            "campaigns from before result stores were configurable: ConfigMap."
        ),
    )
    # One entry per live Shard with history (the window: pending, running, the shards that need a
    # person and a short tail of Done ones); a shard folded into the ledger and deleted leaves it.
    history_folded: dict[str, Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        description=(
            "For each live Shard, the sequence (status.history[].sequence) of its newest history "
            "entry counted in the breakers: the operator counts the entries above it, each once, "
            "whatever the clocks of their writers, and a new leader continues from here. Entries of "
            "shards folded into the ledger and deleted are dropped, so it holds at most as many "
            "entries as there are live Shards. Absent on statuses written by releases before it."
        ),
    )
    history_folded_until: AwareDatetime | None = Field(
        default=None,
        description=(
            "Deprecated: historyFolded replaces it. The newest shard history entry time counted in "
            "the breakers, by which releases before historyFolded chose the entries to count (an "
            "entry written by a lagging clock could be missed). Still written for workers and "
            "operators of those releases; read only from a status without historyFolded: a live "
            "shard's entries up to this time are then taken as counted, once."
        ),
    )

    @computed_field(  # type: ignore[prop-decorator]
        description='Done/total shards as text, for example "8/10", shown by kubectl get.'
    )
    @property
    def progress_text(self) -> str:
        total = self.shards_total if self.shards_total is not None else self.counts.total
        return f"{self.counts.done}/{total}"

    def condition(self, type_: str) -> Condition | None:
        """The condition of that type, or None."""
        return find_condition(self.conditions, type_)

    def with_condition(self, condition: Condition) -> CampaignStatus:
        """A copy with `condition` set (lastTransitionTime kept when its status is unchanged)."""
        return self.model_copy(update={"conditions": set_condition(self.conditions, condition)})

    def breaker(self, source: str) -> BreakerStatus | None:
        """The breaker of that source, or None when it never tripped."""
        return next((b for b in self.breakers if b.source == source), None)


class Campaign(ResourceModel):
    """A Campaign: a body of long, flaky work that shardops splits into leased shards."""

    KIND = CAMPAIGN_KIND

    kind: str = Field(default=CAMPAIGN_KIND, description="Always Campaign.")
    spec: CampaignSpec = Field(description="Desired state.")
    status: CampaignStatus | None = Field(default=None, description="Observed state.")

    @model_validator(mode="after")
    def _name_fits_a_label(self) -> Campaign:
        name = self.metadata.name
        if name is not None and len(name) > rules.CAMPAIGN_NAME_MAX:
            raise ValueError(rules.CAMPAIGN_NAME_FITS_A_LABEL.message)
        return self

    @classmethod
    def parse_items_counted(cls, body: Mapping[str, Any]) -> Campaign:
        """`parse` for readers that need the campaign's shape and state, never its items (a worker's
        look for work, every second): inline spec.items, up to MAX_INLINE_ITEMS objects, are counted
        instead of copied and validated, so the parse costs what the rest of the object costs.
        spec.items then reads as [] (`spec.items_left_out` says so); `spec.inline_items_total`
        gives the count."""
        split = without_inline_items(body)
        if split is None:
            return cls.parse(body)
        lean, count = split
        campaign = cls.parse(lean)
        campaign.spec._counted_items = count
        return campaign

    @property
    def current_status(self) -> CampaignStatus:
        """status, or an empty one for a campaign the operator has not seen yet."""
        return self.status if self.status is not None else CampaignStatus()

    @property
    def retry_requested(self) -> bool:
        """True when spec.retry.generation is ahead of the one the operator last acted on."""
        return self.spec.retry.generation > self.current_status.last_retry_generation

    @property
    def spec_observed(self) -> bool:
        """True when the status reflects the current spec."""
        return self.current_status.observed_generation == self.generation
