"""What a campaign keeps of the shards it folded into its ledger: their counts, cost, index ranges and
recent outcomes (for the error threshold), and the walk of a retry through the ledger. Part of the
Campaign's status; apart from campaign.py because it is the ledger's side of the status."""

from __future__ import annotations

from decimal import Decimal

from pydantic import AwareDatetime, Field

from shardops.api.common import DNS_SUBDOMAIN_MAX, Money, StatusModel, TokenCounts
from shardops.api.enums import ErrorClass

# The largest spec.errorThreshold.window: the status keeps that many folded completions.
MAX_ERROR_WINDOW = 1000


class IndexRange(StatusModel):
    """Shard indices start (inclusive) to end (exclusive)."""

    start: int = Field(ge=0, description="First index.")
    end: int = Field(ge=0, description="Index after the last one.")


class FoldedFailure(StatusModel):
    """A folded shard's non-retryable failure, kept for the error threshold after its Shard is gone."""

    at: AwareDatetime = Field(description="When the attempt failed.")
    error_class: ErrorClass = Field(alias="class", description="Its (non-retryable) error class.")
    shard: str = Field(max_length=DNS_SUBDOMAIN_MAX, description="The shard that failed.")


class RetryWalk(StatusModel):
    """A retry of every gave-up shard under way through the ledger: its folded Failed and Blocked
    shards are cut again a segment at a time, as the backlog bound leaves room."""

    generation: int = Field(ge=1, description="The spec.retry.generation it carries out.")
    next: int = Field(ge=1, description="Sequence of the next ledger segment to read.")
    until: int = Field(ge=0, description="Sequence of the last segment written before the request.")
    handled: int = Field(
        default=0,
        ge=0,
        description=(
            "Gave-up shards of segment `next` (in index order) already handled: a shard cut again, "
            "done and folded anew is never cut a second time."
        ),
    )
    errored: bool | None = Field(
        default=None,
        description=(
            "A retry of the errored items (spec.retry.errored): the walk cuts again the folded Done "
            "shards with errored items, to run just those, instead of the gave-up shards."
        ),
    )


class FoldedShards(StatusModel):
    """Work shards whose facts were written to the campaign's ledger (index range, key, phase, result
    reference and fingerprint or last error, attempts, cost, owner, history) and whose Shard objects
    were then deleted, so a campaign keeps a bounded number of objects however many shards it has
    and however many of them fail. Done shards are folded, and so are Failed and Blocked ones (they
    need a person: the ledger keeps why, `kubectl campaign results --failed` lists them and
    `kubectl campaign retry` brings them back). A shard counts as folded exactly when its index is
    in doneRanges."""

    shards: int = Field(default=0, ge=0, description="Number of folded Done shards.")
    failed: int = Field(default=0, ge=0, description="Number of folded Failed shards.")
    blocked: int = Field(default=0, ge=0, description="Number of folded Blocked shards.")
    items: int = Field(default=0, ge=0, description="Items in the folded Done shards.")
    errored_items: int = Field(
        default=0, ge=0, description="Items of the folded Done shards that failed on their own (errored)."
    )
    cost: Money = Field(
        default=Decimal(0), description="Cost of the folded shards (every phase), in the budget's unit."
    )
    tokens: TokenCounts = Field(
        default_factory=TokenCounts, description="Tokens the folded shards (every phase) used, summed."
    )
    attempts: int = Field(
        default=0, ge=0, description="Attempts the folded shards (every phase) took, summed."
    )
    done_ranges: list[IndexRange] = Field(
        default_factory=list,
        description=(
            "Indices of the folded shards, whatever their phase, as sorted, disjoint ranges: a few, "
            "since shards finish roughly in order and gave-up shards are folded too (one range per gap "
            "left by a live shard, so at most one more than the live work shards)."
        ),
    )
    sequence: int = Field(default=0, ge=0, description="Folds so far; names the next ledger segment.")
    recent_completions: list[AwareDatetime] = Field(
        default_factory=list,
        max_length=MAX_ERROR_WINDOW,
        description=(
            "When the latest folded shards completed (as many as spec.errorThreshold.window): the "
            "error threshold still counts their successes after their Shards are gone."
        ),
    )
    recent_failures: list[FoldedFailure] = Field(
        default_factory=list,
        max_length=MAX_ERROR_WINDOW,
        description=(
            "The latest non-retryable failures of folded shards (as many as "
            "spec.errorThreshold.window): the error threshold still counts them after their Shards "
            "are gone."
        ),
    )

    retry_walk: RetryWalk | None = Field(
        default=None,
        description=(
            "A retry of every gave-up shard still cutting folded ones again (unset when none is): "
            "a shard cut again leaves doneRanges and the failed or blocked count."
        ),
    )

    @property
    def gave_up(self) -> int:
        """Folded shards that need a person (Failed and Blocked)."""
        return self.failed + self.blocked

    @property
    def total(self) -> int:
        """Folded shards of every phase."""
        return self.shards + self.gave_up

    def ranges(self) -> list[tuple[int, int]]:
        return [(r.start, r.end) for r in self.done_ranges]
