"""How many bytes of items one Shard may carry.

A work Shard holds its items (copied in, so the worker never re-reads the campaign's input), and a
Shard is a Kubernetes object: etcd refuses to store one over 1.5 MiB (its default
--max-request-bytes) and the API server a request over 3 MiB. The items get 1 MiB of that; the rest
is the shard's metadata, status and history. The whole input is checked before the first shard is
cut (once per spec generation, in the pass that reads it anyway), so a campaign with a shard that
could never be created says so up front, naming the shard and the fix, instead of stopping at it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# An item: one JSON object of the campaign's input (shardops.api.common.Item, which logic does not import).
Item = Mapping[str, Any]

MAX_SHARD_ITEMS_BYTES = 1024 * 1024


class ShardItemsTooLarge(ValueError):
    """The items of one shard would not fit in its Shard object; the message names the fix."""


def item_bytes(item: Item) -> int:
    """An item's size as the API server stores it: compact JSON, UTF-8."""
    return len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


@dataclass
class ShardItemsSize:
    """Fed the campaign's items in order (`add`), raises ShardItemsTooLarge at the first shard whose
    items pass `limit`. O(1) memory: one shard's running total."""

    shard_size: int
    where: str
    limit: int = MAX_SHARD_ITEMS_BYTES
    _seen: int = field(default=0, init=False)
    _bytes: int = field(default=0, init=False)

    def add(self, item: Item) -> None:
        position = self._seen % self.shard_size
        if position == 0:
            self._bytes = 0
        size = item_bytes(item)
        self._bytes += size
        if self._bytes > self.limit:
            shard, index = self._seen // self.shard_size, self._seen
            if size > self.limit:
                fix = (
                    f"item {index} alone is {size:,} bytes: keep large payloads in object storage and "
                    "pass their keys as items"
                )
            else:
                fitting = max(1, self.limit * (position + 1) // self._bytes)
                fix = f"lower spec.shardSize (about {fitting} items of this size fit)"
            raise ShardItemsTooLarge(
                f"{self.where}: the items of shard {shard} pass {self.limit:,} bytes at item {index}, "
                f"the most a Shard object carries; {fix}"
            )
        self._seen += 1


def check_shard_items(items: Iterable[Item], shard_size: int, where: str) -> None:
    """ShardItemsTooLarge unless every shard of `items` cut `shard_size` at a time fits its Shard."""
    sizes = ShardItemsSize(shard_size, where)
    for item in items:
        sizes.add(item)
