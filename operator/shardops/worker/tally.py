"""The item results of one claimed shard's attempt (`Tally`): which of its items have a result, stored
earlier or read from the command since the last flush, and what the attempt and the shard cost so far.

Pure bookkeeping, no I/O: the holder (holding.py) stores the fresh results and writes progress and cost
into the shard; ShardRun feeds the command's result lines in (`absorb`) and runs what is left
(`remaining`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from shardops.api.common import NO_TOKENS, Item, TokenCounts
from shardops.api.enums import ErrorClass
from shardops.api.item_errors import item_error_of
from shardops.api.money import money_text
from shardops.api.shard import Progress
from shardops.logic.idempotency import item_subkey
from shardops.store.records import ItemRecord
from shardops.worker.runner import CommandFailure, ResultLine, WorkItem


@dataclass
class Tally:
    """The shard's items and the results known for them. `stored`: in the result store (found at the
    claim, or flushed since); `fresh`: read from the command, not yet stored. Both are keyed by item
    subkey and bounded by the shard's items."""

    items: list[Item]
    stored: dict[str, ItemRecord]
    # The shard's cost and tokens before this attempt (its status at the claim).
    base_cost: Decimal = Decimal(0)
    base_tokens: TokenCounts | None = None
    # spec.budget.maxPerShard: the attempt is stopped once the shard's cost passes it (None: no cap).
    cap: Decimal | None = None
    fresh: dict[str, ItemRecord] = field(default_factory=dict)
    attempt_cost: Decimal = Decimal(0)
    attempt_tokens: TokenCounts = NO_TOKENS
    keys: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.keys = [item_subkey(item) for item in self.items]

    def known(self) -> dict[str, ItemRecord]:
        return {**self.stored, **self.fresh}

    def rerun_errored(self, shard_result: str | None) -> None:
        """For a retry of the errored items (status.rerunErrored): the items that succeeded in the
        shard's stored result (`shard_result`, its text) count as stored, each with the cost it had,
        and every errored item's stored result is forgotten, so `remaining()` runs just those again.
        Bounded by the shard's items."""
        if shard_result is not None:
            for key, record in succeeded_items(shard_result).items():
                self.stored.setdefault(key, record)
        self.stored = {key: r for key, r in self.stored.items() if item_error_of(r.result) is None}

    def progress(self) -> Progress:
        known = self.known()
        return Progress(done=sum(1 for key in self.keys if key in known), total=len(self.keys))

    def complete(self) -> Progress:
        """The progress of a shard whose result holds every item, with how many of them errored."""
        # A reused shard result (found stored at the claim) is not read item by item: its errored
        # items are those the tally knows of, possibly none.
        known = self.known()
        errored = sum(1 for key in self.keys if key in known and item_error_of(known[key].result) is not None)
        return Progress(done=len(self.keys), total=len(self.keys), errored=errored or None)

    def first_errored(self) -> tuple[int, Mapping[str, Any]] | None:
        """The index in the shard and the error of its first errored item known, None when none is."""
        known = self.known()
        for index, key in enumerate(self.keys):
            error = item_error_of(known[key].result) if key in known else None
            if error is not None:
                return index, error
        return None

    def cost(self) -> Decimal:
        # Cumulative over the shard's attempts, so the operator can add shard costs up as they are.
        return self.base_cost + self.attempt_cost

    def tokens(self) -> TokenCounts | None:
        """Cumulative over the attempts like cost; None while no attempt reported any."""
        if self.base_tokens is None and not self.attempt_tokens.used:
            return None
        return (self.base_tokens or NO_TOKENS) + self.attempt_tokens

    def remaining(self) -> list[WorkItem]:
        """The items without a result, each key once (a repeated item is computed once)."""
        known = self.known()
        seen: set[str] = set()
        work: list[WorkItem] = []
        for index, (key, item) in enumerate(zip(self.keys, self.items, strict=True)):
            if key in known or key in seen:
                continue
            seen.add(key)
            work.append(WorkItem(key, index, item))
        return work

    def absorb(self, lines: Sequence[ResultLine]) -> None:
        """Take the command's result lines in (the first result of a key counts, every line's cost
        does); CommandFailure (over budget) once the shard's cost passes `cap`."""
        for line in lines:
            if line.key not in self.known():
                self.fresh[line.key] = ItemRecord(line.result, line.cost)
            self.attempt_cost += line.cost
            self.attempt_tokens += line.tokens
        if self.cap is not None and self.cost() > self.cap:
            raise CommandFailure(
                ErrorClass.OVER_BUDGET,
                f"shard cost {money_text(self.cost())} passed the per-shard cap spec.budget.maxPerShard "
                f"{money_text(self.cap)} "
                f"after {self.progress().done} of {len(self.keys)} item(s); the command was stopped",
            )

    def mark_stored(self) -> None:
        """The fresh results were stored: they are stored ones now."""
        self.stored.update(self.fresh)
        self.fresh = {}

    def entries(self) -> tuple[list[tuple[int, str, Any]], dict[str, Decimal]]:
        """The shard result's entries (index, key, result) in item order, and each key's cost. Every
        item must have a result (`remaining()` is empty)."""
        known = self.known()
        entries = [(index, key, known[key].result) for index, key in enumerate(self.keys)]
        return entries, {key: known[key].cost for key in self.keys}


def succeeded_items(shard_result: str) -> dict[str, ItemRecord]:
    """The items of a shard result document (store.records.encode_result) that did not error, by
    sub-key, with what each cost; {} for a document that is not one."""
    try:
        rows = json.loads(shard_result).get("items")
    except (ValueError, AttributeError):
        return {}
    found: dict[str, ItemRecord] = {}
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, Mapping) or not isinstance(row.get("key"), str):
            continue
        if item_error_of(row.get("result")) is not None:
            continue
        try:
            cost = Decimal(str(row.get("cost") or 0))
        except InvalidOperation:
            cost = Decimal(0)
        found[row["key"]] = ItemRecord(row.get("result"), cost)
    return found
