"""Folding Done shards: what of a Done Shard the ledger keeps, and which listed Shards are folded.

A Done work shard's facts go to the campaign's ledger (segments in the result store), its counts
to `status.folded`, and then its Shard is deleted (its Lease with it, by owner reference). A shard
counts as folded exactly when its index is in `status.folded.doneRanges`; a folded Shard still
listed (the operator stopped between recording and deleting) is deleted, never counted again.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shardops.api.campaign import FoldedShards, IndexRange
from shardops.api.common import JSON, NO_TOKENS, TokenCounts
from shardops.api.enums import ShardClass, ShardPhase
from shardops.api.money import money_text
from shardops.api.names import API_GROUP_VERSION, SHARD_KIND
from shardops.api.shard import Shard
from shardops.logic import ranges
from shardops.logic.transitions import EventReason


def is_folded(shard: Shard, folded: FoldedShards) -> bool:
    return shard.spec.shard_class is ShardClass.WORK and ranges.contains(folded.ranges(), shard.spec.index)


def unfolded(shards: Iterable[Shard], folded: FoldedShards) -> list[Shard]:
    """The listed shards that count as live: every one not already folded."""
    spans = folded.ranges()
    return [
        s
        for s in shards
        if s.spec.shard_class is not ShardClass.WORK or not ranges.contains(spans, s.spec.index)
    ]


def foldable(shards: Iterable[Shard], folded: FoldedShards) -> list[Shard]:
    """Done work shards with a result, not folded yet, in index order."""
    spans = folded.ranges()
    return sorted(
        (
            s
            for s in shards
            if s.spec.shard_class is ShardClass.WORK
            and s.phase is ShardPhase.DONE
            and s.current_status.result is not None
            and not ranges.contains(spans, s.spec.index)
        ),
        key=lambda s: s.spec.index,
    )


def record(shard: Shard) -> JSON:
    """The ledger line of a Done shard: everything `kubectl campaign status/report/events/results`
    and reuse need once the Shard object is gone."""
    status = shard.current_status
    item_range = shard.spec.item_range
    return {
        "index": shard.spec.index,
        "shard": shard.name,
        "uid": shard.metadata.uid,
        "itemRange": item_range.to_dict() if item_range is not None else None,
        "items": shard.spec.item_count,
        "idempotencyKey": shard.spec.idempotency_key,
        "source": status.source or shard.spec.source,
        "result": status.result.to_dict() if status.result is not None else None,
        "attempt": status.attempt,
        "cost": money_text(status.cost),
        "tokens": status.tokens.to_dict() if status.tokens is not None else None,
        "owner": (status.history[-1].owner if status.history else None),
        "history": [entry.to_dict() for entry in status.history],
    }


def fold(folded: FoldedShards, shards: Sequence[Shard], keep_completions: int = 0) -> FoldedShards:
    """`folded` with `shards` (from `foldable`) counted in; the latest `keep_completions`
    completion times are kept for the error threshold."""
    if not shards:
        return folded
    spans = ranges.add(folded.ranges(), (s.spec.index for s in shards))
    completions = sorted(
        [
            *folded.recent_completions,
            *(e.at for s in shards for e in s.current_status.history if e.reason == EventReason.COMPLETED),
        ]
    )
    return FoldedShards(
        shards=folded.shards + len(shards),
        items=folded.items + sum(s.spec.item_count for s in shards),
        cost=folded.cost + sum(s.current_status.cost for s in shards),
        tokens=sum_tokens(shards, folded.tokens),
        attempts=folded.attempts + sum(max(s.current_status.attempt, 1) for s in shards),
        done_ranges=[IndexRange(start=a, end=b) for a, b in spans],
        sequence=folded.sequence + 1,
        recent_completions=completions[-keep_completions:] if keep_completions > 0 else [],
    )


def sum_tokens(shards: Iterable[Shard], start: TokenCounts = NO_TOKENS) -> TokenCounts:
    """`start` plus the tokens the shards reported."""
    total = start
    for shard in shards:
        if shard.current_status.tokens is not None:
            total += shard.current_status.tokens
    return total


def campaign_tokens(previous: TokenCounts, folded: FoldedShards, live: Iterable[Shard]) -> TokenCounts:
    """The campaign's tokens: the folded shards' (status.folded.tokens) plus the live shards', never
    below what the status said before (a deleted or edited Shard cannot un-use tokens). `live`: the
    unfolded shards, so nothing is counted twice; O(window)."""
    return sum_tokens(live, folded.tokens).at_least(previous)


def shard_body(record: JSON, namespace: str, campaign: str) -> JSON:
    """A folded shard rebuilt from its ledger record as a Shard body (Done, its result, attempt,
    cost and whole history), for the readers that take Shards: events, benchmarks."""
    spec: JSON = {
        "campaign": campaign,
        "index": record["index"],
        "shardClass": str(ShardClass.WORK),
        "idempotencyKey": record["idempotencyKey"],
    }
    if record.get("itemRange"):
        spec["itemRange"] = record["itemRange"]
    if record.get("source"):
        spec["source"] = record["source"]
    return {
        "apiVersion": API_GROUP_VERSION,
        "kind": SHARD_KIND,
        "metadata": {"name": record["shard"], "namespace": namespace, "uid": record.get("uid")},
        "spec": spec,
        "status": {
            "phase": str(ShardPhase.DONE),
            "attempt": record.get("attempt") or 0,
            "cost": record.get("cost") or 0,
            **({"tokens": record["tokens"]} if record.get("tokens") else {}),
            "result": record.get("result"),
            "history": record.get("history") or [],
        },
    }


def first_records(lines: Iterable[JSON], folded: FoldedShards) -> dict[int, JSON]:
    """The ledger's records by shard index: the first record of each index that is folded. A segment
    written by a fold whose status write then failed may repeat or precede the counted one."""
    spans = folded.ranges()
    found: dict[int, JSON] = {}
    for line in lines:
        index = line.get("index")
        if isinstance(index, int) and index not in found and ranges.contains(spans, index):
            found[index] = line
    return found
