"""Every finished item of a campaign, in item order: the one reader behind `kubectl campaign results`
and the finalize shard's `SHARDOPS_CAMPAIGN_RESULTS_FILE`.

A campaign's finished items are those of its Done work shards: the live ones (their status.result
names the stored result and its fingerprint) and those folded into the ledger (a ledger record says
the same). Each line is `index` (in the campaign), `key` (the item's sub-key), `item`, `result`,
`cost`, `shard`, `attempt`. Pure: the store is reached only through the functions handed in
(`read` for one verified stored result, the ledger's lines, the campaign's items).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from shardops.api.campaign import Campaign
from shardops.api.common import JSON, Item
from shardops.api.enums import ShardClass, ShardPhase
from shardops.api.folded import FoldedShards
from shardops.api.money import JsonNumber, money_text, parse_money
from shardops.api.shard import Shard
from shardops.k8s.api import CAMPAIGNS, KubeClient
from shardops.k8s.shards import list_shards
from shardops.logic import ranges
from shardops.state import ledger, shardview
from shardops.store import ResultStore
from shardops.store.records import StoreCorrupt
from shardops.store.s3 import S3Store

# (ref, key) -> (fingerprint, text) of the verified stored result; raises StoreCorrupt.
ReadResult = Callable[[str, str], tuple[str, str]]


class ResultsMismatch(Exception):
    """What the state says was finished is not what the store holds: a stored result whose
    fingerprint is not the one its shard's status recorded, or folded shards missing from the
    ledger. Nothing of the campaign's results can be trusted past this point."""


def work_shards(shards: Iterable[Shard]) -> list[Shard]:
    """The work shards in item order (finalize shards hold no items)."""
    work = [s for s in shards if s.spec.shard_class is ShardClass.WORK]
    return sorted(work, key=lambda s: s.spec.item_range.start if s.spec.item_range else s.spec.index)


def first_index(shard: Shard) -> int:
    """The campaign index of the shard's first item (a shard without an itemRange holds its own
    items, numbered from 0)."""
    return shard.spec.item_range.start if shard.spec.item_range else 0


@dataclass(frozen=True)
class Finished:
    """A Done work shard, live or folded into the ledger: where its result is and which items it
    held — `items` for a live shard (its spec carries them), `end` for a folded one (its items are
    read from the campaign's, in item order, only when its lines are written)."""

    shard: str
    first_item: int
    end: int
    key: str
    ref: str
    fingerprint: str
    attempt: int
    items: Sequence[Item] | None = None

    @classmethod
    def of_shard(cls, shard: Shard) -> Finished | None:
        result = shard.current_status.result
        if shard.phase is not ShardPhase.DONE or result is None:
            return None
        items = list(shard.spec.items or [])
        start = first_index(shard)
        return cls(
            shard.name,
            start,
            start + len(items),
            shard.spec.idempotency_key,
            result.ref,
            result.fingerprint,
            shard.current_status.attempt,
            items,
        )

    @classmethod
    def of_record(cls, record: JSON) -> Finished:
        span = record.get("itemRange") or {}
        result = record.get("result") or {}
        return cls(
            str(record["shard"]),
            int(span.get("start", 0)),
            int(span.get("end", 0)),
            str(record["idempotencyKey"]),
            str(result.get("ref")),
            str(result.get("fingerprint")),
            int(record.get("attempt") or 0),
        )


def campaign_and_shards(kube: KubeClient, namespace: str, name: str) -> tuple[Campaign, list[Shard]]:
    """The Campaign as it is now and the Shards that are its own, for a whole-campaign read of its
    results (the finalize shard, the Batch API's files). The Shards are listed before the Campaign is
    read: a fold records its shards in the status before it deletes them, so a shard missing from the
    list is in the status read after it (read the other way round, a shard folded in between is in
    neither). `finished_shards` counts one listed and already folded once."""
    listed = list_shards(kube, namespace, name)
    campaign = Campaign.parse(kube.get(CAMPAIGNS, namespace, name))
    return campaign, shardview.of_campaign(listed, campaign)


def finished_shards(
    campaign_name: str,
    work: Sequence[Shard],
    folded: FoldedShards,
    ledger_lines: Callable[[], Iterable[JSON]],
) -> list[Finished]:
    """Every Done work shard in item order: the live ones and those folded into the ledger. Bounded
    by the campaign's Done shards: this is a whole-campaign read (results, the finalize shard), never
    on a per-shard path. A shard listed live while the status read after the list says it is folded
    (the fold records it, then deletes it) counts once, from the ledger: its live copy is on its way
    out (`campaign_and_shards` reads them in that order)."""
    live = ledger.unfolded(work, folded)
    finished = [f for f in (Finished.of_shard(s) for s in live) if f is not None]
    if folded.shards:
        done = folded_done(ledger_lines(), folded)
        if len(done) != folded.shards:
            raise ResultsMismatch(
                f"the ledger of campaign {campaign_name} holds {len(done)} of its {folded.shards} "
                "folded Done shards"
            )
        finished += done.values()
    return sorted(finished, key=lambda f: f.first_item)


def folded_done(lines: Iterable[JSON], folded: FoldedShards) -> dict[int, Finished]:
    """The folded Done shards by index, from the ledger's lines as they stream by (the first Done
    line of each folded index, as `ledger.first_records` keeps): only their compact `Finished` is
    kept, never a line (with its whole history, ~5 KB) past its segment."""
    spans = folded.ranges()
    found: dict[int, Finished] = {}  # one per folded Done shard: the result read needs them all
    for line in lines:
        index = line.get("index")
        if (
            isinstance(index, int)
            and index not in found
            and ledger.record_phase(line) is ShardPhase.DONE
            and ranges.contains(spans, index)
        ):
            found[index] = Finished.of_record(line)
    return found


def done_lines(
    read: ReadResult, finished: Sequence[Finished], every_item: Callable[[], Sequence[Item]]
) -> Iterator[tuple[Finished, JSON]]:
    """(shard, line) for every item of every Done shard, in the order given (item order), from its
    verified result. `every_item` is the campaign's items, asked for only when a folded shard's
    items are needed and then sliced in increasing order (a streamed input is read once)."""
    campaign_items: Sequence[Item] | None = None
    for done in finished:
        try:
            fingerprint, text = read(done.ref, done.key)
        except StoreCorrupt as corrupt:
            raise ResultsMismatch(
                f"shard {done.shard}: its stored result does not verify: {corrupt}"
            ) from None
        if fingerprint != done.fingerprint:
            raise ResultsMismatch(
                f"shard {done.shard}: the stored result is {fingerprint}, its status says {done.fingerprint}"
            )
        items = done.items
        if items is None:
            if campaign_items is None:
                campaign_items = every_item()
            items = campaign_items[done.first_item : done.end]
        document = json.loads(text, parse_float=JsonNumber)
        for entry in document.get("items") or []:
            position = int(entry["index"])
            yield (
                done,
                {
                    "index": done.first_item + position,
                    "key": entry.get("key"),
                    "item": items[position] if position < len(items) else None,
                    "result": entry.get("result"),
                    # A decimal string (documents written before hold a number: read from its text).
                    "cost": money_text(parse_money(entry["cost"])) if "cost" in entry else None,
                    "shard": done.shard,
                    "attempt": done.attempt,
                },
            )


def read_verified(store: ResultStore) -> ReadResult:
    """A shard's verified stored result as `done_lines` reads it: (fingerprint, text)."""

    def read(ref: str, key: str) -> tuple[str, str]:
        stored = store.read_ref(ref, key)
        return stored.fingerprint, stored.text

    return read


def ledger_of(
    store: ResultStore, campaign: Campaign, between_segments: Callable[[], None] | None = None
) -> Callable[[], Iterable[JSON]]:
    """The campaign's ledger lines, read when called, one segment at a time; `between_segments` is
    called after each (the finalize shard renews its claim there). Only an S3 store holds a ledger."""

    def lines() -> Iterator[JSON]:
        if not isinstance(store, S3Store):
            raise ResultsMismatch(f"campaign {campaign.name} has folded shards but no S3 result store")
        for segment in store.read_ledger_segments(campaign.name, campaign.metadata.uid or ""):
            yield from segment
            if between_segments is not None:
                between_segments()

    return lines


def json_line(value: JSON) -> str:
    """One JSONL line (no newline): compact, UTF-8 kept — but U+2028 and U+2029 escaped: JSON lets
    them stand raw in a string, yet line readers split on them (Python's str.splitlines, JavaScript
    before ES2019), cutting an item in two. Escaped, they decode to the same string."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
