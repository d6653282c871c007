"""`kubectl campaign results NAME`: every finished item's result in item order, as JSONL.

One line per item of each Done work shard, read from the campaign's result store (the object its
status.result names, verified against the fingerprint there): `index` (in the campaign), `key`
(the item's sub-key), `item`, `result`, `cost`, `shard`, `attempt`. `--format openai` writes the
OpenAI batch output shape instead, with `custom_id` taken from an item field. `--failed` lists the
items not done, with their shard's phase and lastError. Works on a running campaign (what is done
so far) and on a finished one. Reads one object per Done shard; nothing is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, TextIO

from shardops.api.campaign import Campaign, ResultStoreStatus
from shardops.api.common import Item
from shardops.api.enums import ShardClass, ShardPhase, StoreType
from shardops.api.shard import Shard
from shardops.cli.campaign_client import EXIT_OK, bad_state, no_access
from shardops.cli.command import Context, load
from shardops.k8s.campaigns import ItemsUnavailable
from shardops.logic.idempotency import item_subkey
from shardops.state import ledger
from shardops.store import ResultStore, location_of, open_store
from shardops.store.items import StreamedItems
from shardops.store.records import StoreCorrupt, StoreUnavailable
from shardops.store.s3 import S3Store, client_for

JSON = dict[str, Any]
FORMATS = ("jsonl", "openai")
DEFAULT_CUSTOM_ID = "custom_id"


def json_line(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def work_shards(shards: Sequence[Shard]) -> list[Shard]:
    """The work shards in item order (finalize shards hold no items)."""
    work = [s for s in shards if s.spec.shard_class is ShardClass.WORK]
    return sorted(work, key=lambda s: s.spec.item_range.start if s.spec.item_range else s.spec.index)


def _first_index(shard: Shard) -> int:
    return shard.spec.item_range.start if shard.spec.item_range else 0


@dataclass(frozen=True)
class Finished:
    """A Done work shard, live or folded into the ledger: where its result is and what it held."""

    shard: str
    first_item: int
    key: str
    ref: str
    fingerprint: str
    attempt: int
    items: Sequence[Item]

    @classmethod
    def of_shard(cls, shard: Shard) -> Finished | None:
        result = shard.current_status.result
        if shard.phase is not ShardPhase.DONE or result is None:
            return None
        return cls(
            shard.name,
            _first_index(shard),
            shard.spec.idempotency_key,
            result.ref,
            result.fingerprint,
            shard.current_status.attempt,
            list(shard.spec.items or []),
        )

    @classmethod
    def of_record(cls, record: JSON, every_item: Sequence[Item]) -> Finished:
        span = record.get("itemRange") or {}
        start, end = int(span.get("start", 0)), int(span.get("end", 0))
        result = record.get("result") or {}
        return cls(
            str(record["shard"]),
            start,
            str(record["idempotencyKey"]),
            str(result.get("ref")),
            str(result.get("fingerprint")),
            int(record.get("attempt") or 0),
            list(every_item[start:end]),
        )


def done_lines(store: ResultStore, finished: Sequence[Finished]) -> Iterator[tuple[Finished, JSON]]:
    """(shard, line) for every item of every Done shard, in the order given, from its verified result."""
    for done in finished:
        try:
            stored = store.read_ref(done.ref, done.key)
        except StoreCorrupt as corrupt:
            raise bad_state(f"shard {done.shard}: its stored result does not verify: {corrupt}") from None
        if stored.fingerprint != done.fingerprint:
            raise bad_state(
                f"shard {done.shard}: the stored result is {stored.fingerprint}, its status says "
                f"{done.fingerprint}"
            )
        document = json.loads(stored.text)
        for entry in document.get("items") or []:
            position = int(entry["index"])
            yield (
                done,
                {
                    "index": done.first_item + position,
                    "key": entry.get("key"),
                    "item": done.items[position] if position < len(done.items) else None,
                    "result": entry.get("result"),
                    "cost": entry.get("cost"),
                    "shard": done.shard,
                    "attempt": done.attempt,
                },
            )


def openai_line(line: JSON, field: str) -> JSON:
    """One line of the OpenAI batch output format for a `done_lines` line."""
    item = line.get("item")
    if not isinstance(item, dict) or field not in item:
        raise bad_state(
            f"item {line['index']} (shard {line['shard']}) has no field {field!r} for custom_id: "
            "name the item field that identifies each request with --custom-id FIELD"
        )
    return {
        "id": f"{line['shard']}-{line['index']}",
        "custom_id": str(item[field]),
        "response": {"status_code": 200, "request_id": line["key"], "body": line["result"]},
        "error": None,
    }


def failed_lines(
    shards: Sequence[Shard], every_item: Sequence[Item] | None, cut_items: int = 0
) -> Iterator[JSON]:
    """Every item not done: those of shards not Done (with the phase and lastError), then those not
    yet cut into shards (`every_item` is the campaign's items, read only when some are uncut)."""
    cut_until = cut_items
    for shard in shards:
        cut_until = max(cut_until, shard.spec.item_range.end if shard.spec.item_range else 0)
        if shard.phase is ShardPhase.DONE:
            continue
        status = shard.current_status
        error = status.last_error.to_dict() if status.last_error is not None else None
        for position, item in enumerate(shard.spec.items or []):
            yield {
                "index": _first_index(shard) + position,
                "key": item_subkey(item),
                "item": item,
                "shard": shard.name,
                "phase": str(shard.phase or ShardPhase.QUEUED),
                "attempt": status.attempt,
                "lastError": error,
            }
    for index in range(cut_until, len(every_item or [])):
        item = (every_item or [])[index]
        yield {"index": index, "key": item_subkey(item), "item": item, "shard": None, "phase": "Uncut"}


def _items(ctx: Context, campaign: Campaign) -> Sequence[Item]:
    if campaign.spec.items is not None:
        return list(campaign.spec.items)
    assert campaign.spec.items_from is not None  # the model requires one of the two
    source = campaign.spec.items_from.object
    if source is not None:
        # Read as a stream, sliced in item order as the lines are written.
        store = cli_store(ctx, campaign)
        if not isinstance(store, S3Store):
            raise bad_state("spec.itemsFrom.object needs the campaign's S3 result store")
        return StreamedItems(lambda: store.open_lines(source.key, source.bucket), source.key)
    try:
        return ctx.client.read_items(campaign.namespace, campaign.spec.items_from)
    except ItemsUnavailable as problem:
        what = f"the campaign's items are unavailable ({problem.reason})"
        raise bad_state(f"{what}: {problem.message}") from None


def cli_store(ctx: Context, campaign: Campaign) -> ResultStore:
    """The campaign's store as the user reaches it: --s3-endpoint over the recorded endpoint (the
    in-cluster one may not resolve outside), credentials from AWS_* in the environment, else from
    the campaign's credentials Secret (read with the user's own RBAC)."""
    location = location_of(campaign)
    if location.type is not StoreType.S3:
        return open_store(ctx.client.kube, campaign.namespace, location)
    endpoint = getattr(ctx.args, "s3_endpoint", None)  # the commands that read the store take --s3-endpoint
    if endpoint:
        location = location.model_copy(update={"endpoint": endpoint})
    return user_s3_store(ctx, location, campaign.namespace)


def user_s3_store(ctx: Context, location: ResultStoreStatus, namespace: str) -> S3Store:
    """An S3 store with the user's credentials: AWS_* in the environment, else the keys of the
    location's credentials Secret (read with the user's own RBAC)."""
    credentials = None
    if not os.environ.get("AWS_ACCESS_KEY_ID") and location.credentials_secret:
        credentials = ctx.client.secret_data(namespace, location.credentials_secret)
    return S3Store(location, namespace, client=client_for(location, credentials))


class _Progress:
    """`done/total shards` on a terminal's stderr while writing to a file; silent otherwise."""

    def __init__(self, stream: TextIO, total: int, enabled: bool) -> None:
        self.stream, self.total, self.enabled, self.done = stream, total, enabled, 0

    def step(self) -> None:
        self.done += 1
        if self.enabled:
            self.stream.write(f"\rresults: {self.done}/{self.total} shard(s)")
            self.stream.flush()

    def finish(self, lines: int) -> None:
        if self.enabled:
            self.stream.write(f"\rresults: {self.done}/{self.total} shard(s), {lines} line(s)\n")
            self.stream.flush()


def finished_shards(
    ctx: Context, campaign: Campaign, store: ResultStore, work: Sequence[Shard]
) -> list[Finished]:
    """Every Done work shard in item order: the live ones, and those folded into the ledger."""
    finished = [f for f in (Finished.of_shard(s) for s in work) if f is not None]
    folded = campaign.current_status.folded
    if folded.shards:
        if not isinstance(store, S3Store):
            raise bad_state(f"campaign {campaign.name} has folded shards but no S3 result store")
        records = ledger.first_records(store.read_ledger(campaign.name, campaign.metadata.uid or ""), folded)
        if len(records) != folded.shards:
            raise bad_state(
                f"the ledger of campaign {campaign.name} holds {len(records)} of its {folded.shards} "
                "folded shards"
            )
        every = _items(ctx, campaign)
        finished += [Finished.of_record(record, every) for record in records.values()]
    return sorted(finished, key=lambda f: f.first_item)


def _cut_items(campaign: Campaign, work: Sequence[Shard]) -> int:
    """Items already cut into shards (live, folded or deleted): the items after are Uncut."""
    live = max((s.spec.item_range.end for s in work if s.spec.item_range), default=0)
    recorded = (campaign.current_status.cut_shards or 0) * campaign.spec.shard_size
    return max(live, recorded)


def run_results(ctx: Context) -> int:
    args = ctx.args
    _, campaign, _, shards = load(ctx, args.name)
    work = work_shards(shards)
    with ExitStack() as stack:
        out: TextIO = ctx.stdout
        if args.output_file and args.output_file != "-":
            out = stack.enter_context(open(args.output_file, "w", encoding="utf-8"))
        lines = 0
        if args.failed:
            for line in failed_lines(work, _items(ctx, campaign), _cut_items(campaign, work)):
                out.write(json_line(line) + "\n")
                lines += 1
            return EXIT_OK
        try:
            store = cli_store(ctx, campaign)
            done = finished_shards(ctx, campaign, store, work)
            progress = _Progress(ctx.stderr, len(done), out is not ctx.stdout and ctx.stderr.isatty())
            previous: str | None = None
            for finished, line in done_lines(store, done):
                if finished.shard != previous:
                    progress.step()
                    previous = finished.shard
                shown = openai_line(line, args.custom_id) if args.format == "openai" else line
                out.write(json_line(shown) + "\n")
                lines += 1
        except StoreUnavailable as unavailable:
            hint = "--s3-endpoint reaches the store another way"
            raise no_access(f"cannot read results: {unavailable} ({hint})") from None
        progress.finish(lines)
    return EXIT_OK
