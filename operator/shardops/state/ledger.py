"""Folding finished shards: what of a Done, Failed or Blocked Shard the ledger keeps, and which
listed Shards are folded.

A finished work shard's facts go to the campaign's ledger (segments in the result store), its counts
to `status.folded`, and then its Shard is deleted (its Lease with it). Shards that gave up (Failed,
Blocked) are folded too, all but the newest `GAVE_UP_TAIL`, so neither the Shards alive nor the
status grow with the failures of a campaign; their ledger lines keep the phase and last error, for
`kubectl campaign results --failed` and `retry`. A shard counts as folded exactly when its index is
in `status.folded.doneRanges`; a folded Shard still listed (the operator stopped between recording
and deleting) is deleted, never counted again. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shardops.api.campaign import MAX_LISTED_SHARDS
from shardops.api.common import JSON, NO_TOKENS, TokenCounts
from shardops.api.enums import ShardClass, ShardPhase
from shardops.api.folded import FoldedFailure, FoldedShards, IndexRange
from shardops.api.money import money_text
from shardops.api.names import API_GROUP_VERSION, SHARD_KIND
from shardops.api.shard import Shard
from shardops.logic import ranges
from shardops.logic.transitions import EventReason

# Gave-up (Failed, Blocked) work shards kept live, the newest ones: enough to fill the status's lists
# of their names and to show `kubectl describe`; the rest are folded. Bounds them in the window.
GAVE_UP_TAIL = MAX_LISTED_SHARDS
GAVE_UP = (ShardPhase.FAILED, ShardPhase.BLOCKED)


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


def foldable(shards: Iterable[Shard], folded: FoldedShards, keep_gave_up: int = GAVE_UP_TAIL) -> list[Shard]:
    """Work shards not folded yet, in index order: the Done ones with a result, and the Failed and
    Blocked ones but the newest `keep_gave_up` (by when they gave up)."""
    spans = folded.ranges()
    unfolded_work = [
        s
        for s in shards
        if s.spec.shard_class is ShardClass.WORK and not ranges.contains(spans, s.spec.index)
    ]
    done = [s for s in unfolded_work if s.phase is ShardPhase.DONE and s.current_status.result is not None]
    gave_up = sorted((s for s in unfolded_work if s.phase in GAVE_UP), key=_gave_up_order)
    older = gave_up[: max(0, len(gave_up) - keep_gave_up)]
    return sorted([*done, *older], key=lambda s: s.spec.index)


def _gave_up_order(shard: Shard) -> tuple[str, int]:
    history = shard.current_status.history
    return (history[-1].at.isoformat() if history else "", shard.spec.index)


def record(shard: Shard) -> JSON:
    """The ledger line of a finished shard: everything `kubectl campaign status/report/events/results`,
    `retry` and reuse need once the Shard object is gone."""
    status = shard.current_status
    item_range = shard.spec.item_range
    last = status.history[-1] if status.history else None
    return {
        "index": shard.spec.index,
        "shard": shard.name,
        "uid": shard.metadata.uid,
        "phase": str(shard.phase),
        "itemRange": item_range.to_dict() if item_range is not None else None,
        "items": shard.spec.item_count,
        # A Done shard's items that errored on their own (progress.errored): `retry --errored` reruns
        # them, and takes them out of the folded counts when it cuts the shard again.
        "errored": status.errored_items if shard.phase is ShardPhase.DONE else 0,
        "retryGeneration": status.retry_generation,
        "idempotencyKey": shard.spec.idempotency_key,
        "source": status.source or shard.spec.source,
        "result": status.result.to_dict() if status.result is not None else None,
        # Why a gave-up shard stopped: its last error (message bounded by the Shard API) and reason.
        "lastError": status.last_error.to_dict() if status.last_error is not None else None,
        "reason": last.reason if last is not None and shard.phase in GAVE_UP else None,
        "attempt": status.attempt,
        "cost": money_text(status.cost),
        "tokens": status.tokens.to_dict() if status.tokens is not None else None,
        "owner": (last.owner if last is not None else None),
        "history": [entry.to_dict() for entry in status.history],
    }


def record_phase(line: JSON) -> ShardPhase:
    """The phase a ledger line records; lines written before gave-up shards were folded are Done."""
    try:
        return ShardPhase(line.get("phase") or ShardPhase.DONE)
    except ValueError:
        return ShardPhase.DONE


def fold(folded: FoldedShards, shards: Sequence[Shard], keep_completions: int = 0) -> FoldedShards:
    """`folded` with `shards` (from `foldable`) counted in, each in its phase; the latest
    `keep_completions` completion times and non-retryable failures are kept for the error
    threshold."""
    if not shards:
        return folded
    spans = ranges.add(folded.ranges(), (s.spec.index for s in shards))
    done = [s for s in shards if s.phase is ShardPhase.DONE]
    # A Done shard all of whose items errored ends as a failure for the threshold, like a Failed one.
    errored = {s.name: s.current_status.failed_item_by_item() for s in done}
    completions = sorted(
        [
            *folded.recent_completions,
            *(
                e.at
                for s in done
                if errored[s.name] is None
                for e in s.current_status.history
                if e.reason == EventReason.COMPLETED
            ),
        ]
    )
    failures = sorted(
        [
            *folded.recent_failures,
            *(
                FoldedFailure(at=e.at, error_class=e.error_class, shard=s.name)
                for s in shards
                for e in s.current_status.history
                if e.reason == EventReason.FAILED
                and e.error_class is not None
                and not e.error_class.retryable
            ),
            *(
                FoldedFailure(at=e.at, error_class=error_class, shard=s.name)
                for s in done
                if (error_class := errored[s.name]) is not None
                for e in s.current_status.history
                if e.reason == EventReason.COMPLETED
            ),
        ],
        key=lambda f: (f.at, f.shard),
    )
    keep = keep_completions if keep_completions > 0 else 0
    return FoldedShards(
        shards=folded.shards + len(done),
        failed=folded.failed + sum(1 for s in shards if s.phase is ShardPhase.FAILED),
        blocked=folded.blocked + sum(1 for s in shards if s.phase is ShardPhase.BLOCKED),
        items=folded.items + sum(s.spec.item_count for s in done),
        errored_items=folded.errored_items + sum(s.current_status.errored_items for s in done),
        cost=folded.cost + sum(s.current_status.cost for s in shards),
        tokens=sum_tokens(shards, folded.tokens),
        attempts=folded.attempts + sum(max(s.current_status.attempt, 1) for s in shards),
        done_ranges=[IndexRange(start=a, end=b) for a, b in spans],
        sequence=folded.sequence + 1,
        recent_completions=completions[-keep:] if keep else [],
        recent_failures=failures[-keep:] if keep else [],
        retry_walk=folded.retry_walk,
    )


def _reran(line: JSON, known: JSON) -> bool:
    """Whether Done record `line` is of a later retry of its errored items than Done record `known`."""
    return record_phase(line) is ShardPhase.DONE and _generation(line) > _generation(known)


def _generation(line: JSON) -> int:
    generation = line.get("retryGeneration")
    return generation if isinstance(generation, int) else 0


def errored_items(line: JSON) -> int:
    """The errored items a ledger line's Done shard counted (0 for a line written before they were
    recorded, or a gave-up shard)."""
    count = line.get("errored")
    return count if isinstance(count, int) and record_phase(line) is ShardPhase.DONE else 0


def unfold(folded: FoldedShards, lines: Sequence[JSON]) -> FoldedShards:
    """`folded` without the shards of these ledger lines (cut again by a retry, the gave-up ones, or
    the Done ones with errored items by a retry of those): their indices leave the ranges, their
    phases' counts go down (a Done shard's items and errored items with them). Their cost, tokens
    and attempts stay counted (spent is spent; the new Shard starts from none)."""
    if not lines:
        return folded
    phases = [record_phase(line) for line in lines]
    done = [line for line, phase in zip(lines, phases, strict=True) if phase is ShardPhase.DONE]
    return folded.model_copy(
        update={
            "shards": folded.shards - len(done),
            "items": folded.items - sum(int(line.get("items") or 0) for line in done),
            "errored_items": folded.errored_items - sum(errored_items(line) for line in done),
            "failed": folded.failed - phases.count(ShardPhase.FAILED),
            "blocked": folded.blocked - phases.count(ShardPhase.BLOCKED),
            "done_ranges": [
                IndexRange(start=a, end=b)
                for a, b in ranges.remove(folded.ranges(), (int(line["index"]) for line in lines))
            ],
        }
    )


def sum_tokens(shards: Iterable[Shard], start: TokenCounts = NO_TOKENS) -> TokenCounts:
    """`start` plus the tokens the shards reported."""
    total = start
    for shard in shards:
        if shard.current_status.tokens is not None:
            total += shard.current_status.tokens
    return total


def campaign_errored_items(folded: FoldedShards, live: Iterable[Shard]) -> int:
    """Errored items of the campaign: the folded Done shards' plus the live Done shards'."""
    return folded.errored_items + sum(
        s.current_status.errored_items for s in live if s.phase is ShardPhase.DONE
    )


def campaign_tokens(previous: TokenCounts, folded: FoldedShards, live: Iterable[Shard]) -> TokenCounts:
    """The campaign's tokens: the folded shards' (status.folded.tokens) plus the live shards', never
    below what the status said before (a deleted or edited Shard cannot un-use tokens). `live`: the
    unfolded shards, so nothing is counted twice; O(window)."""
    return sum_tokens(live, folded.tokens).at_least(previous)


def shard_body(record: JSON, namespace: str, campaign: str) -> JSON:
    """A folded shard rebuilt from its ledger record as a Shard body (its phase, result or last error,
    attempt, cost and whole history), for the readers that take Shards: events, benchmarks."""
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
            "phase": str(record_phase(record)),
            **({"lastError": record["lastError"]} if record.get("lastError") else {}),
            "attempt": record.get("attempt") or 0,
            "cost": record.get("cost") or 0,
            **({"tokens": record["tokens"]} if record.get("tokens") else {}),
            **({"result": record["result"]} if record.get("result") else {}),
            "history": record.get("history") or [],
        },
    }


def first_records(lines: Iterable[JSON], folded: FoldedShards) -> dict[int, JSON]:
    """The ledger's records by shard index, of each index that is folded: its Done record when it has
    one (the first: a segment written by a fold whose status write then failed may repeat or precede
    the counted one; but a Done record of a later retry of its errored items, by its retryGeneration,
    replaces an earlier one), else its newest gave-up record (a retried shard that gave up again)."""
    spans = folded.ranges()
    found: dict[int, JSON] = {}
    for line in lines:
        index = line.get("index")
        if not isinstance(index, int) or not ranges.contains(spans, index):
            continue
        known = found.get(index)
        if known is None or record_phase(known) is not ShardPhase.DONE or _reran(line, known):
            found[index] = line
    return found
