"""The Shard resource: one claimable slice of a campaign, and the record of its attempts.

Shards are created by the operator, not by users; their status is written only by shardops
code (operator and worker), which the chart enforces with a ValidatingAdmissionPolicy.
"""

from __future__ import annotations

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
    Item,
    Money,
    ResourceModel,
    SourceName,
    SpecModel,
    StatusModel,
    TokenCounts,
    cel_rules,
    keeping_last,
    truncating,
    without_inline_items,
)
from shardops.api.enums import ErrorClass, ShardClass, ShardPhase
from shardops.api.items import MAX_INLINE_ITEMS
from shardops.api.names import SHARD_KIND

# Each transition appends one entry; the oldest fall off so a shard that flaps for days stays a
# small object. Events and metrics keep the full story.
HISTORY_LIMIT = 20
ERROR_MESSAGE_MAX = 1024
REASON_MAX = 128
IDEMPOTENCY_KEY_MAX = 253


class ItemRange(SpecModel):
    """A slice of the campaign's items: indices start (inclusive) to end (exclusive)."""

    model_config = ConfigDict(json_schema_extra=cel_rules(rules.ITEM_RANGE_ORDERED))

    start: int = Field(ge=0, description="Index of the first item, counting from 0.")
    end: int = Field(ge=0, description="Index after the last item (exclusive).")

    @model_validator(mode="after")
    def _ordered(self) -> ItemRange:
        if self.start > self.end:
            raise ValueError(rules.ITEM_RANGE_ORDERED.message)
        return self

    def __len__(self) -> int:
        return self.end - self.start


class ShardSpec(SpecModel):
    """What this shard covers. Written once by the operator when it creates the shard."""

    model_config = ConfigDict(json_schema_extra=cel_rules(rules.WORK_SHARD_HAS_ITEMS))

    campaign: str = Field(
        min_length=1, max_length=DNS_SUBDOMAIN_MAX, description="Name of the Campaign (same namespace)."
    )
    index: int = Field(ge=0, description="Position of the shard in its campaign, from 0.")
    shard_class: ShardClass = Field(
        default=ShardClass.WORK,
        description=(
            "work shards process items; the finalize shard runs the campaign's closing step. Default work."
        ),
    )
    items: list[Item] | None = Field(
        default=None,
        max_length=MAX_INLINE_ITEMS,
        description=(
            "The shard's items, copied from the campaign; absent when itemRange points into itemsFrom."
        ),
    )
    item_range: ItemRange | None = Field(
        default=None, description="The indices of the shard's items in the campaign's item list."
    )
    source: SourceName | None = Field(
        default=None, description="The source these items call, before any fallback. Default: none."
    )
    idempotency_key: str = Field(
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX,
        description=(
            "Hash of campaign, shard input and command; the same on every retry. A result stored under "
            "it is reused instead of recomputed."
        ),
    )
    priority: int = Field(
        default=0,
        ge=-1000000,
        le=1000000,
        description="Dispatch order within the campaign: higher first. Default 0.",
    )

    @model_validator(mode="after")
    def _work_has_items(self) -> ShardSpec:
        if self.shard_class == ShardClass.WORK and self.items is None and self.item_range is None:
            raise ValueError(rules.WORK_SHARD_HAS_ITEMS.message)
        return self

    @property
    def is_finalize(self) -> bool:
        """True for the campaign's closing step."""
        return self.shard_class == ShardClass.FINALIZE

    @property
    def item_count(self) -> int:
        """Number of items this shard covers (inline items win over the range)."""
        # The private attribute read from pydantic's own dict: its __getattr__ for private attributes
        # costs more than the rest of this property, and a worker's look counts every shard's items.
        counted = (self.__pydantic_private__ or {}).get("_counted_items")
        if counted is not None:
            return int(counted)
        if self.items is not None:
            return len(self.items)
        if self.item_range is not None:
            return len(self.item_range)
        return 0

    @property
    def items_left_out(self) -> bool:
        """True when parsed by `Shard.parse_items_counted`: spec.items reads as [] and only
        `item_count` is true to the object (`Shard.with_items` gives the whole shard)."""
        return self._counted_items is not None

    # Set only by Shard.parse_items_counted.
    _counted_items: int | None = PrivateAttr(default=None)


class Progress(StatusModel):
    """Items finished out of the shard's total, as the last heartbeat reported."""

    done: int = Field(default=0, ge=0, description="Items finished.")
    total: int = Field(default=0, ge=0, description="Items in the shard.")
    errored: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Of the items finished, those that failed on their own (a 400 for that request, an answer "
            "that does not match the schema): recorded as that item's error while the rest of the shard "
            "completed. Unset when none did."
        ),
    )


class ShardResult(StatusModel):
    """Where the shard's result is stored."""

    ref: str = Field(
        max_length=DNS_SUBDOMAIN_MAX,
        description="Reference to the stored result (by default the name of a ConfigMap in the namespace).",
    )
    fingerprint: str = Field(max_length=128, description="SHA-256 of the stored bytes, as sha256:<hex>.")
    bytes: int = Field(ge=0, description="Size of the stored result in bytes.")


class ShardError(StatusModel):
    """The last failure of the shard."""

    error_class: ErrorClass = Field(
        alias="class", description="Error class; decides whether the shard is retried."
    )
    source: str | None = Field(
        default=None, max_length=SOURCE_NAME_MAX, description="Source that failed, when the command said."
    )
    message: Annotated[str, BeforeValidator(truncating(ERROR_MESSAGE_MAX))] = Field(
        default="",
        max_length=ERROR_MESSAGE_MAX,
        description=f"What went wrong, cut to {ERROR_MESSAGE_MAX} characters.",
    )
    event: str | None = Field(
        default=None, max_length=DNS_SUBDOMAIN_MAX, description="Name of the Event that recorded the failure."
    )
    at: AwareDatetime | None = Field(default=None, description="When the failure happened (RFC 3339).")
    retry_at: AwareDatetime | None = Field(
        default=None,
        description=(
            "For a rate-limited failure whose upstream said how long to wait (Retry-After): when the "
            "source may be called again. Every worker of the campaign holds off that source until then."
        ),
    )


class HistoryEntry(StatusModel):
    """One transition of the shard."""

    phase: ShardPhase = Field(description="Phase entered.")
    at: AwareDatetime = Field(description="When (RFC 3339).")
    reason: str = Field(
        max_length=REASON_MAX,
        description="CamelCase reason of the transition, also the reason of its Event, for example Claimed.",
    )
    attempt: int = Field(default=0, ge=0, description="Attempt number at the transition.")
    owner: str | None = Field(
        default=None, max_length=DNS_SUBDOMAIN_MAX, description="Worker holding the claim."
    )
    event: str | None = Field(
        default=None, max_length=DNS_SUBDOMAIN_MAX, description="Name of the Event recording the transition."
    )
    # The operator folds these into the per-source breakers in time order; lastError alone would lose
    # a failure when two land between two of its reads.
    source: str | None = Field(
        default=None,
        max_length=SOURCE_NAME_MAX,
        description="Source the attempt used (after any fallback), when the shard has one.",
    )
    error_class: ErrorClass | None = Field(
        default=None, description="Error class of a failed attempt (AttemptFailed, Failed, Blocked)."
    )
    # The operator folds each shard's entries above the last sequence it folded, never by `at`: the
    # writers' clocks differ (a worker's may lag by seconds), their order on one shard does not.
    sequence: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Number of the entry in the shard's whole history: 1 for its first transition, one more "
            "for each after it, also once older entries were dropped. Written by whoever appends the "
            "entry. Entries written by releases before this field have none: each counts as one above "
            "the entry before it (entries before the first numbered one count back from it; a history "
            "without numbers starts at 1)."
        ),
    )


History = Annotated[list[HistoryEntry], BeforeValidator(keeping_last(HISTORY_LIMIT))]


def history_sequences(history: Sequence[HistoryEntry]) -> list[int]:
    """The sequence of each entry of a history (oldest first), its own where it has one.

    Entries written before entries carried a sequence are numbered from what is there: an entry
    without one is one above the entry before it; entries before the first numbered entry count
    back from it; a history with no numbered entry counts from 1 at its oldest entry. So a history
    that never reached HISTORY_LIMIT is numbered from 1 as if every writer had numbered it, and
    once a writer of this release appends to an older history, the numbers of the older entries
    no longer change as the oldest fall off (they count back from the newest numbered one).

    What this cannot repair: a writer of an earlier release (a worker image not yet upgraded)
    rewrites the whole history without the field; a shard of more than HISTORY_LIMIT transitions
    that such a writer touched is numbered from 1 again, and its entries up to the sequence the
    operator had already folded are not folded (a breaker misses them, it never counts one twice).
    A number that does not rise (never written by shardops) is taken as one above the entry before.
    """
    first = next(((i, e.sequence) for i, e in enumerate(history) if e.sequence is not None), None)
    number = first[1] - first[0] - 1 if first is not None and first[1] > first[0] else 0
    numbers: list[int] = []
    for entry in history:
        number = entry.sequence if entry.sequence is not None and entry.sequence > number else number + 1
        numbers.append(number)
    return numbers


class ShardStatus(StatusModel):
    """The shard's phase, claim and attempts. Written by the operator and the claiming worker only."""

    phase: ShardPhase | None = Field(default=None, description="Where the shard is in its life.")
    attempt: int = Field(
        default=0, ge=0, description="Attempts started so far; a claim after a failure adds one."
    )
    owner: str | None = Field(
        default=None, max_length=DNS_SUBDOMAIN_MAX, description="Worker (pod name) holding the claim."
    )
    lease_until: AwareDatetime | None = Field(
        default=None, description="When the claim expires unless renewed by a heartbeat."
    )
    last_heartbeat: AwareDatetime | None = Field(default=None, description="When the owner last heartbeated.")
    progress: Progress | None = Field(default=None, description="Progress from the last heartbeat.")
    cost: Money = Field(default=Decimal(0), description="Cost reported for this shard, in the budget's unit.")
    tokens: TokenCounts | None = Field(
        default=None,
        description=(
            "Tokens the shard's items used, over all its attempts (absent when the command reports none)."
        ),
    )
    not_before: AwareDatetime | None = Field(
        default=None, description="Earliest time the shard may be claimed again (backoff)."
    )
    result: ShardResult | None = Field(default=None, description="Where the result is stored, once Done.")
    last_error: ShardError | None = Field(default=None, description="The last failure.")
    history: History = Field(
        default_factory=list,
        max_length=HISTORY_LIMIT,
        description=f"The last {HISTORY_LIMIT} transitions, oldest first; older ones are dropped.",
    )
    fencing_token: int | None = Field(
        default=None,
        ge=0,
        description=(
            "The Lease's leaseTransitions at claim time; fences out writes from a worker whose claim "
            "was taken over."
        ),
    )
    source: str | None = Field(
        default=None, max_length=SOURCE_NAME_MAX, description="Source actually used, after any fallback."
    )
    retry_generation: int | None = Field(
        default=None,
        ge=0,
        description=(
            "The Campaign's spec.retry.generation that last sent this shard back to Pending, written "
            "with that transition: a retry request is applied to a shard once, even when the pass "
            "that applied it is repeated (a lost status write, a new leader)."
        ),
    )
    rerun_errored: bool | None = Field(
        default=None,
        description=(
            "Set with the transition back to Pending by a retry of the errored items (kubectl campaign "
            "retry --errored): the attempts run again the items that errored on their own and keep "
            "the stored results of the others, instead of reusing the shard's stored result."
        ),
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status was computed from."
    )

    @computed_field(  # type: ignore[prop-decorator]
        description='Items done/total as text, for example "3/5", shown by kubectl get.'
    )
    @property
    def progress_text(self) -> str | None:
        if self.progress is None:
            return None
        return f"{self.progress.done}/{self.progress.total}"

    @property
    def errored_items(self) -> int:
        """Items of the shard that failed on their own (progress.errored), 0 when none did."""
        return (self.progress.errored or 0) if self.progress is not None else 0

    def failed_item_by_item(self) -> ErrorClass | None:
        """The class of a Done shard none of whose items succeeded (each one errored on its own, its
        lastError says how), None otherwise: the error threshold counts it as a failure, so a template
        field no item has holds the campaign as it did when such an item failed its shard."""
        if self.phase is not ShardPhase.DONE or self.last_error is None or self.progress is None:
            return None
        every = self.progress.total > 0 and self.errored_items >= self.progress.total
        return self.last_error.error_class if every else None

    def sequences(self) -> list[int]:
        """The sequence of each history entry, oldest first (`history_sequences`)."""
        return history_sequences(self.history)

    @property
    def last_sequence(self) -> int:
        """The sequence of the newest history entry; 0 for a shard without history."""
        numbers = self.sequences()
        return numbers[-1] if numbers else 0

    def with_history(self, entry: HistoryEntry) -> ShardStatus:
        """A copy with `entry` appended, numbered one above the newest entry (`last_sequence`), and
        the history cut to the last HISTORY_LIMIT entries. The one way an entry is added: every
        transition of the operator and of the workers goes through it (`k8s.shards.planned_status`)."""
        numbered = entry.model_copy(update={"sequence": self.last_sequence + 1})
        return self.model_copy(update={"history": [*self.history, numbered][-HISTORY_LIMIT:]})


class Shard(ResourceModel):
    """A Shard: one claimable slice of a Campaign."""

    KIND = SHARD_KIND

    kind: str = Field(default=SHARD_KIND, description="Always Shard.")
    spec: ShardSpec = Field(description="What the shard covers.")
    status: ShardStatus | None = Field(default=None, description="Observed state.")

    @classmethod
    def parse_items_counted(cls, body: Mapping[str, Any]) -> Shard:
        """`parse` for readers that plan over shards and never read their items (a worker's look for
        work lists the window every second): inline spec.items, ~90 % of what parsing a shard of 100
        items costs, are counted instead of copied and validated. spec.items then reads as []
        (`spec.items_left_out` says so); `with_items` parses the whole object, once it is claimed."""
        split = without_inline_items(body)
        if split is None:
            return cls.parse(body)
        lean, count = split
        shard = cls.parse(lean)
        shard.spec._counted_items = count
        shard._body = body
        return shard

    def with_items(self) -> Shard:
        """This shard with its items: itself, or the whole object a lean parse left them out of."""
        if not self.spec.items_left_out or self._body is None:
            return self
        return Shard.parse(self._body)

    # The object a lean parse came from (Shard.parse_items_counted); None otherwise.
    _body: Mapping[str, Any] | None = PrivateAttr(default=None)

    @property
    def current_status(self) -> ShardStatus:
        """status, or an empty one for a shard nobody has written yet."""
        return self.status if self.status is not None else ShardStatus()

    @property
    def phase(self) -> ShardPhase | None:
        """status.phase, or None before the operator set one."""
        return self.current_status.phase

    @property
    def campaign_name(self) -> str:
        """spec.campaign."""
        return self.spec.campaign

    @property
    def lease_name(self) -> str:
        """Name of the coordination.k8s.io Lease that claims this shard: the shard's own name."""
        return self.name
