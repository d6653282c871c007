"""`kubectl campaign results NAME`: every finished item's result in item order, as JSONL.

One line per item of each Done work shard, read from the campaign's result store (the object its
status.result names, verified against the fingerprint there): `index` (in the campaign), `key`
(the item's sub-key), `item`, `result`, `cost`, `shard`, `attempt`, and `error` for an item that
failed on its own (api/item_errors.py). `--format openai` writes OpenAI's batch output and error
files instead (api/openai_batch.py; the error lines to `--error-file` when given): for a campaign of
OpenAI batch lines the upstream's own status code, request id and body, else the item's result as
the body with `custom_id` taken from an item field. `--failed` lists the items not done, with their
shard's phase and lastError: the live shards', then those of the Failed and Blocked shards folded
into the ledger (streamed from it), then the uncut ones, then the errored items of Done shards. Works on a
running campaign (what is done so far) and on a finished one. Reads one object per Done shard;
nothing is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from typing import TextIO

from shardops.api import openai_batch
from shardops.api.campaign import Campaign
from shardops.api.common import JSON, Item
from shardops.api.enums import LlmRequestFormat, ShardPhase, StoreType
from shardops.api.folded import FoldedShards
from shardops.api.item_errors import item_error_of
from shardops.api.shard import Shard
from shardops.api.store import ResultStoreStatus
from shardops.cli.campaign_client import EXIT_OK, bad_state, no_access
from shardops.cli.command import Context, load
from shardops.k8s.campaigns import ItemsUnavailable
from shardops.logic import ranges
from shardops.logic.idempotency import item_subkey
from shardops.state import ledger, results
from shardops.state.results import Finished, json_line, work_shards
from shardops.store import ResultStore, location_of, open_store
from shardops.store.items import campaign_items
from shardops.store.records import StoreUnavailable
from shardops.store.s3 import S3Store, client_for

FORMATS = ("jsonl", "openai")
DEFAULT_CUSTOM_ID = "custom_id"


def openai_line(line: JSON, field: str, batch: bool) -> JSON:
    """`openai_batch.file_line`, its missing custom_id field named as the fix."""
    try:
        return openai_batch.file_line(line, field, batch)
    except ValueError as missing:
        raise bad_state(
            f"{missing}: name the item field that identifies each request with --custom-id FIELD"
        ) from None


def jsonl_line(line: JSON) -> JSON:
    """A `done_lines` line as `results` prints it: an errored item's error in `error`, beside what
    its command reported (`result`, absent when nothing)."""
    error = item_error_of(line.get("result"))
    if error is None:
        return line
    reported = line["result"].get("result")
    return {**{k: v for k, v in line.items() if k != "result"}, "result": reported, "error": dict(error)}


def errored_lines(done: Iterable[tuple[Finished, JSON]]) -> Iterator[JSON]:
    """The errored items of Done shards, as `results --failed` lists them (phase Done, their error)."""
    for _, line in done:
        error = item_error_of(line.get("result"))
        if error is not None:
            yield {
                **{k: v for k, v in line.items() if k not in ("result", "cost")},
                "phase": str(ShardPhase.DONE),
                "lastError": dict(error),
            }


def failed_lines(
    shards: Sequence[Shard],
    every_item: Sequence[Item] | None,
    cut_items: int = 0,
    folded: Iterable[JSON] = (),
) -> Iterator[JSON]:
    """Every item not done: those of shards not Done (with the phase and lastError), then those of
    the folded gave-up shards (`folded`: `folded_failed_lines`), then those not yet cut into shards
    (`every_item` is the campaign's items, read only when some are uncut)."""
    cut_until = cut_items
    for shard in shards:
        cut_until = max(cut_until, shard.spec.item_range.end if shard.spec.item_range else 0)
        if shard.phase is ShardPhase.DONE:
            continue
        status = shard.current_status
        error = status.last_error.to_dict() if status.last_error is not None else None
        for position, item in enumerate(shard.spec.items or []):
            yield {
                "index": results.first_index(shard) + position,
                "key": item_subkey(item),
                "item": item,
                "shard": shard.name,
                "phase": str(shard.phase or ShardPhase.QUEUED),
                "attempt": status.attempt,
                "lastError": error,
            }
    yield from folded
    for index in range(cut_until, len(every_item or [])):
        item = (every_item or [])[index]
        yield {"index": index, "key": item_subkey(item), "item": item, "shard": None, "phase": "Uncut"}


def folded_failed_lines(
    ledger_lines: Iterable[JSON], folded: FoldedShards, every_item: Callable[[], Sequence[Item]]
) -> Iterator[JSON]:
    """The items of the Failed and Blocked shards folded into the ledger, as `failed_lines` prints
    them, streamed from the ledger's lines (one segment held at a time). Each folded index once:
    the set of those listed is bounded by the campaign's gave-up shards (integers only)."""
    spans = folded.ranges()
    listed: set[int] = set()
    items: Sequence[Item] | None = None
    for record in ledger_lines:
        index = record.get("index")
        phase = ledger.record_phase(record)
        if not isinstance(index, int) or phase not in ledger.GAVE_UP or index in listed:
            continue
        if not ranges.contains(spans, index):
            continue
        listed.add(index)
        span = record.get("itemRange") or {}
        start, end = int(span.get("start", 0)), int(span.get("end", 0))
        if items is None:
            items = every_item()
        for position, item in enumerate(items[start:end]):
            yield {
                "index": start + position,
                "key": item_subkey(item),
                "item": item,
                "shard": record.get("shard"),
                "phase": str(phase),
                "attempt": record.get("attempt") or 0,
                "lastError": record.get("lastError"),
            }


def _items(ctx: Context, campaign: Campaign) -> Sequence[Item]:
    """The campaign's items as the user reaches them (an object through the user's S3 store)."""
    store = cli_store(ctx, campaign) if campaign.spec.items_from and campaign.spec.items_from.object else None
    try:
        return campaign_items(ctx.client.kube, campaign, store if isinstance(store, S3Store) else None)
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
    ledger_lines = results.ledger_of(store, campaign)
    try:
        return results.finished_shards(campaign.name, work, campaign.current_status.folded, ledger_lines)
    except results.ResultsMismatch as mismatch:
        raise bad_state(str(mismatch)) from None


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
        errors: TextIO | None = None
        if getattr(args, "error_file", None):
            errors = stack.enter_context(open(args.error_file, "w", encoding="utf-8"))
        llm = campaign.spec.worker.llm
        batch = llm is not None and llm.format is LlmRequestFormat.OPENAI_BATCH
        # A batch line's custom_id is its own field of that name, whatever --custom-id says.
        custom_id = "custom_id" if batch else args.custom_id
        lines = 0
        if args.failed:
            every_item = _items(ctx, campaign)
            gave_up: Iterable[JSON] = ()
            if campaign.current_status.folded.gave_up:
                gave_up = folded_failed_lines(
                    results.ledger_of(cli_store(ctx, campaign), campaign)(),
                    campaign.current_status.folded,
                    lambda: every_item,
                )
            try:
                for line in failed_lines(work, every_item, _cut_items(campaign, work), gave_up):
                    out.write(json_line(line) + "\n")
                    lines += 1
                store = cli_store(ctx, campaign)
                answered = results.done_lines(
                    results.read_verified(store),
                    finished_shards(ctx, campaign, store, work),
                    lambda: every_item,
                )
                for line in errored_lines(answered):
                    out.write(json_line(line) + "\n")
                    lines += 1
            except results.ResultsMismatch as mismatch:
                raise bad_state(str(mismatch)) from None
            except StoreUnavailable as error:
                raise no_access(f"cannot read the ledger of its folded shards: {error}") from None
            return EXIT_OK
        try:
            store = cli_store(ctx, campaign)
            done = finished_shards(ctx, campaign, store, work)
            progress = _Progress(ctx.stderr, len(done), out is not ctx.stdout and ctx.stderr.isatty())
            previous: str | None = None
            for finished, line in results.done_lines(
                results.read_verified(store), done, lambda: _items(ctx, campaign)
            ):
                if finished.shard != previous:
                    progress.step()
                    previous = finished.shard
                if args.format != "openai":
                    out.write(json_line(jsonl_line(line)) + "\n")
                else:
                    shown = openai_line(line, custom_id, batch)
                    # OpenAI's two files: the errored items' lines go to --error-file when given.
                    target = errors if shown["error"] is not None and errors is not None else out
                    target.write(json_line(shown) + "\n")
                lines += 1
        except results.ResultsMismatch as mismatch:
            raise bad_state(str(mismatch)) from None
        except StoreUnavailable as unavailable:
            hint = "--s3-endpoint reaches the store another way"
            raise no_access(f"cannot read results: {unavailable} ({hint})") from None
        progress.finish(lines)
    return EXIT_OK
