"""Items read as a stream from a JSONL object (optionally gzip): counted, and every line checked,
in one pass; then handed out slice by slice through a cursor, so the memory a campaign's input
costs is the slice asked for (the window's shards), not the file.

Every input is a tenant's and read by the shared operator: lines are bounded as they stream
(store.lines), counts by MAX_OBJECT_ITEMS / MAX_CONFIGMAP_ITEMS, every item's `source` checked
against the Shard's rule. And each input is pinned at its first read (status.itemsPin): the object's
ETag (sent as If-Match on every later read) or the ConfigMap value's SHA-256; a later read that finds
other content raises ItemsChanged instead of cutting shards from a mix of the two."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import overload

from shardops.api.campaign import Campaign
from shardops.api.common import JSON, Item
from shardops.api.enums import ConditionReason, LlmRequestFormat
from shardops.api.items import (
    MAX_OBJECT_ITEMS,
    ItemsObject,
    ItemsOverLimit,
    ItemsPin,
    check_inline_items,
    parse_item_line,
)
from shardops.api.openai_batch import check_batch_lines
from shardops.k8s import campaigns
from shardops.k8s.api import KubeClient
from shardops.logic.shard_items import ShardItemsSize
from shardops.store.lines import ItemsChanged
from shardops.store.s3 import OpenedItems, S3Store

NEEDS_S3 = (
    "spec.itemsFrom.object needs an S3 result store: set spec.resultStore.type: S3 (or the "
    "chart's resultStore.type: S3), or list the items in a ConfigMap (itemsFrom.configMapName)"
)


class StreamedItems(Sequence[Item]):
    """The items of one object. `open_lines(etag)` opens the object afresh (one GET; only the
    version `etag` names, when given) and gives its lines and ETag.

    Slices are expected in increasing order (shards are cut in index order): each continues the
    open stream; a slice before the cursor reopens the object and skips to it (after a restart,
    once). The first open pins the version read (`pin`, or the `pinned` one the campaign's status
    recorded): every later open asks for that version, ItemsChanged when the object is another now.
    """

    def __init__(
        self,
        open_lines: Callable[[str | None], OpenedItems],
        where: str,
        shard_size: int | None = None,
        pinned: ItemsPin | None = None,
        source: str = "",
    ) -> None:
        self._open = open_lines
        self.where = where
        # When set, the counting pass also checks that each shard's items fit its Shard object.
        self.shard_size = shard_size
        self.source = source or where
        self.pin = pinned
        self._total: int | None = None
        self._stream: Iterator[Item] | None = None
        self._position = 0  # index of the next item the open stream yields

    def _items(self) -> Iterator[Item]:
        opened = self._open(self.pin.etag if self.pin is not None else None)
        if self.pin is None:
            self.pin = ItemsPin(source=self.source, etag=opened.etag)
        elif self.pin.etag is not None and opened.etag is not None and opened.etag != self.pin.etag:
            raise ItemsChanged(self.where, f"ETag {self.pin.etag}", f"ETag {opened.etag}")
        count = 0
        for number, line in enumerate(opened.lines, start=1):
            item = parse_item_line(line, number, self.where)
            if item is None:
                continue
            count += 1
            if count > MAX_OBJECT_ITEMS:
                raise ItemsOverLimit(
                    f"{self.where} line {number}",
                    "more items than one itemsFrom object may hold",
                    MAX_OBJECT_ITEMS,
                    "split the input into several campaigns",
                )
            yield item

    def total(self) -> int:
        """Read the whole object once: the number of items; ValueError at the first bad line,
        ItemsUnavailable past a bound (store.lines, MAX_OBJECT_ITEMS), and ShardItemsTooLarge (with
        a `shard_size`) at the first shard whose items would not fit."""
        if self._total is None:
            sizes = ShardItemsSize(self.shard_size, self.where) if self.shard_size else None
            count = 0
            try:
                for item in self._items():
                    if sizes is not None:
                        sizes.add(item)
                    count += 1
            except ItemsOverLimit as over:  # its message names the line, the limit and the fix
                raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_INVALID, str(over)) from None
            self._total = count
        return self._total

    def __len__(self) -> int:
        return self.total()

    @overload
    def __getitem__(self, index: int) -> Item: ...

    @overload
    def __getitem__(self, index: slice) -> list[Item]: ...

    def __getitem__(self, index: int | slice) -> Item | list[Item]:
        if isinstance(index, int):
            found = self[index : index + 1]
            if not found:
                raise IndexError(index)
            return found[0]
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("streamed items are sliced in order, step 1")
        if self._stream is None or start < self._position:
            self._stream, self._position = self._items(), 0
        taken: list[Item] = []
        while self._position < stop:
            item = next(self._stream, None)
            if item is None:
                break
            if self._position >= start:
                taken.append(item)
            self._position += 1
        return taken


def object_items(
    source: ItemsObject, s3: S3Store | None, shard_size: int | None = None, pinned: ItemsPin | None = None
) -> StreamedItems:
    """The items of `spec.itemsFrom.object`, streamed from the campaign's S3 store (not read yet);
    with a `shard_size`, counting them also checks that each shard's items fit its Shard; with
    `pinned` (status.itemsPin), only that version of the object is read."""
    if s3 is None:
        raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_NOT_FOUND, NEEDS_S3)
    problem = outside_area_problem(source, s3)
    if problem is not None:
        raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_OUTSIDE_NAMESPACE, problem)
    where = f"s3://{source.bucket or s3.location.bucket}/{source.key}"
    return StreamedItems(
        lambda etag: s3.open_items(source.key, source.bucket, if_match=etag),
        where,
        shard_size,
        pinned,
        source=f"object {source.key}" + (f" in bucket {source.bucket}" if source.bucket else ""),
    )


def outside_area_problem(source: ItemsObject, s3: S3Store) -> str | None:
    """Why `spec.itemsFrom.object` may not be read, naming where it must live; None when it is in the
    campaign's namespace's area (`<prefix>/<namespace>/` of its store's bucket). The operator reads
    it with the installation's keys, which reach every namespace's area: without this check a
    campaign could take another namespace's objects as its items."""
    area = s3.location.area(s3.namespace)
    if source.bucket in (None, s3.location.bucket) and source.key.startswith(area):
        return None
    named = f"s3://{source.bucket or s3.location.bucket}/{source.key}"
    return (
        f"spec.itemsFrom.object names {named}, outside this namespace's area of the result store: "
        f"items must live under s3://{s3.location.bucket}/{area} (leave spec.itemsFrom.object.bucket "
        f"unset; `kubectl campaign apply --items FILE` uploads a file there)"
    )


class PinnedItems(list[Item]):
    """Items read whole (a ConfigMap's), with what was read (`pin`)."""

    def __init__(self, items: Sequence[Item], pin: ItemsPin | None) -> None:
        super().__init__(items)
        self.pin = pin


def configmap_items(kube: KubeClient, campaign: Campaign) -> PinnedItems:
    """The items of the campaign's itemsFrom ConfigMap; ItemsChanged when its value is not what
    status.itemsPin recorded at the first read."""
    source = campaign.spec.items_from
    if source is None or source.config_map_name is None:
        raise ValueError("configmap_items needs a campaign with spec.itemsFrom.configMapName")
    items, pin = campaigns.read_items(kube, campaign.namespace, source)
    pinned = campaign.current_status.items_pin
    if pinned is not None and pinned.differs(pin):
        raise ItemsChanged(
            f"ConfigMap {source.config_map_name} key {source.key} (spec.itemsFrom)",
            pinned.describe(),
            pin.describe(),
        )
    return PinnedItems(items, pinned or pin)


def check_inline(items: Sequence[Item]) -> None:
    """ItemsUnavailable naming the first inline item whose `source` no Shard could carry."""
    try:
        check_inline_items(items)
    except ValueError as error:
        raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_INVALID, f"{error}; fix that item") from None


def check_batch_lines_of(campaign: Campaign, items: Sequence[Item], where: str) -> None:
    """ItemsUnavailable naming the first item of a campaign of OpenAI batch lines (llm format
    openai-batch) that is not one or repeats a custom_id. For the items the operator holds anyway
    (inline, at most MAX_INLINE_ITEMS; a ConfigMap's, at most MAX_CONFIGMAP_ITEMS), so the set of
    custom_ids is bounded as they are; an object's lines are checked by whoever uploads it
    (kubectl campaign apply --items), and a line that is not one is that item's error at run time."""
    llm = campaign.spec.worker.llm
    if llm is None or llm.format is not LlmRequestFormat.OPENAI_BATCH:
        return
    try:
        check_batch_lines(items, where)
    except ValueError as error:
        raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_INVALID, f"{error}; fix that line") from None


def pin_patch(campaign: Campaign, items: Sequence[Item]) -> JSON:
    """The status patch that records what the campaign's items were read from (status.itemsPin),
    when they came from itemsFrom and it is not recorded yet; {} otherwise."""
    pin = getattr(items, "pin", None)
    if not isinstance(pin, ItemsPin) or campaign.current_status.items_pin is not None:
        return {}
    return {"itemsPin": pin.to_dict()}


def campaign_items(kube: KubeClient, campaign: Campaign, s3: S3Store | None) -> Sequence[Item]:
    """Every item of the campaign: inline, a ConfigMap's (read now) or an object's (streamed), the
    itemsFrom content the campaign pinned (status.itemsPin) or ItemsChanged.
    Raises campaigns.ItemsUnavailable naming the problem and its fix."""
    if campaign.spec.items_left_out:
        raise ValueError("campaign_items needs a Campaign parsed with its items (Campaign.parse)")
    if campaign.spec.items is not None:
        return campaign.spec.items
    source = campaign.spec.items_from
    if source is None:  # pragma: no cover - the model requires one of the two
        raise campaigns.ItemsUnavailable(ConditionReason.NO_ITEMS, "set spec.items or spec.itemsFrom")
    if source.object is not None:
        return object_items(source.object, s3, pinned=campaign.current_status.items_pin)
    return configmap_items(kube, campaign)
