"""Items read as a stream from a JSONL object (optionally gzip): counted, and every line checked,
in one pass; then handed out slice by slice through a cursor, so the memory a campaign's input
costs is the slice asked for (the window's shards), not the file."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import overload

from shardops.api.campaign import Campaign, ItemsObject, parse_item_line
from shardops.api.common import Item
from shardops.api.enums import ConditionReason
from shardops.k8s import campaigns
from shardops.k8s.api import KubeClient
from shardops.logic.shard_items import ShardItemsSize
from shardops.store.s3 import S3Store

NEEDS_S3 = (
    "spec.itemsFrom.object needs an S3 result store: set spec.resultStore.type: S3 (or the "
    "chart's resultStore.type: S3), or list the items in a ConfigMap (itemsFrom.configMapName)"
)


class StreamedItems(Sequence[Item]):
    """The items of one object. `open_lines` opens the object afresh (one GET) and yields its lines.

    Slices are expected in increasing order (shards are cut in index order): each continues the
    open stream; a slice before the cursor reopens the object and skips to it (after a restart,
    once).
    """

    def __init__(
        self, open_lines: Callable[[], Iterator[str]], where: str, shard_size: int | None = None
    ) -> None:
        self._open = open_lines
        self.where = where
        # When set, the counting pass also checks that each shard's items fit its Shard object.
        self.shard_size = shard_size
        self._total: int | None = None
        self._stream: Iterator[Item] | None = None
        self._position = 0  # index of the next item the open stream yields

    def _items(self) -> Iterator[Item]:
        for number, line in enumerate(self._open(), start=1):
            item = parse_item_line(line, number, self.where)
            if item is not None:
                yield item

    def total(self) -> int:
        """Read the whole object once: the number of items; ValueError at the first bad line, and
        ShardItemsTooLarge (with a `shard_size`) at the first shard whose items would not fit."""
        if self._total is None:
            sizes = ShardItemsSize(self.shard_size, self.where) if self.shard_size else None
            count = 0
            for item in self._items():
                if sizes is not None:
                    sizes.add(item)
                count += 1
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


def object_items(source: ItemsObject, s3: S3Store | None, shard_size: int | None = None) -> StreamedItems:
    """The items of `spec.itemsFrom.object`, streamed from the campaign's S3 store (not read yet);
    with a `shard_size`, counting them also checks that each shard's items fit its Shard."""
    if s3 is None:
        raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_NOT_FOUND, NEEDS_S3)
    where = f"s3://{source.bucket or s3.location.bucket}/{source.key}"
    return StreamedItems(lambda: s3.open_lines(source.key, source.bucket), where, shard_size)


def campaign_items(kube: KubeClient, campaign: Campaign, s3: S3Store | None) -> Sequence[Item]:
    """Every item of the campaign: inline, a ConfigMap's (read now) or an object's (streamed).
    Raises campaigns.ItemsUnavailable naming the problem and its fix."""
    if campaign.spec.items_left_out:
        raise ValueError("campaign_items needs a Campaign parsed with its items (Campaign.parse)")
    if campaign.spec.items is not None:
        return campaign.spec.items
    source = campaign.spec.items_from
    if source is None:  # pragma: no cover - the model requires one of the two
        raise campaigns.ItemsUnavailable(ConditionReason.NO_ITEMS, "set spec.items or spec.itemsFrom")
    if source.object is not None:
        return object_items(source.object, s3)
    return campaigns.read_items(kube, campaign.namespace, source)[0]
