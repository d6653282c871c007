"""Where a campaign's items come from: inline, a ConfigMap key, or an object in the result store."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from shardops.api import rules
from shardops.api.common import (
    DNS_SUBDOMAIN_MAX,
    DNS_SUBDOMAIN_PATTERN,
    SOURCE_NAME_MAX,
    SOURCE_NAME_PATTERN,
    Item,
    SpecModel,
    StatusModel,
    cel_rules,
)
from shardops.api.store import BUCKET_PATTERN

# Inline items are stored in the Campaign object (etcd caps objects at ~1.5 MiB) and the
# API server's CEL cost estimate needs a bound; bigger campaigns use itemsFrom.
MAX_INLINE_ITEMS = 10000

CONFIGMAP_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"

# --- Bounds on a campaign's items: every one a tenant's input, read by the shared operator ---------
# The largest object `itemsFrom.object` may name, compressed or not: the operator reads it as a
# stream (memory bounded by the window), but a campaign's input this large is a mistake to refuse
# before it costs hours of counting.
MAX_ITEMS_OBJECT_BYTES = 64 * 1024**3

# The longest line of items (bytes, UTF-8, without its newline) any reader holds: lines are split as
# the bytes stream in, so one line is all the memory an input costs. An item is carried by its Shard,
# whose items may take 1 MiB (logic.shard_items): a longer line could never be cut into a shard.
MAX_ITEM_LINE_BYTES = 1024 * 1024

# The most bytes a gzip object may inflate to: the same ceiling as an uncompressed object, so that
# compressing an input never lets more through than uploading it plain.
MAX_ITEMS_DECOMPRESSED_BYTES = MAX_ITEMS_OBJECT_BYTES

# The most a gzip input may inflate per byte, once past GZIP_RATIO_GRACE_BYTES of output. JSONL
# compresses 5-20 times, repetitive JSONL about 100; a decompression bomb inflates ~1000 times, so it
# is refused after reading a few MiB, before it costs minutes of the operator's CPU.
MAX_GZIP_RATIO = 200

GZIP_RATIO_GRACE_BYTES = 8 * 1024 * 1024

# The most items of one itemsFrom ConfigMap: the operator holds them parsed (a Python object each)
# for the campaign's whole run, and a 1 MiB ConfigMap of `{}` lines would be 350,000 objects.
MAX_CONFIGMAP_ITEMS = 100_000

# The most items of one itemsFrom object: each (re)read counts them all, and the finalize shard reads
# them once more; past ten million, split the input into several campaigns.
MAX_OBJECT_ITEMS = 10_000_000

# How deep an item's JSON may nest: Python's parser recurses per level, so a line of 100,000 `[`
# would raise RecursionError (not a ValueError) in the middle of the operator's pass.
MAX_ITEM_DEPTH = 64

# The schema an item's `source` key must meet: the Shard's spec.source (api.shard), which the API
# server checks on every shard cut from it.
ITEM_SOURCE_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": SOURCE_NAME_MAX,
    "pattern": SOURCE_NAME_PATTERN,
}


class ItemsOverLimit(ValueError):
    """An input of items passes one of the bounds above: the message names the input, the line (or
    the count) and the limit, and goes on the campaign's Ready condition as is."""

    def __init__(self, where: str, what: str, limit: int, fix: str, unit: str = "") -> None:
        super().__init__(f"{where}: {what}, over the limit of {limit:,}{unit}: {fix}")
        self.where = where
        self.limit = limit


class ItemsObject(SpecModel):
    """An object of JSONL items in the campaign's S3 result store (or another bucket of it)."""

    key: str = Field(
        min_length=1,
        max_length=1024,
        description=(
            "Object key, for example inputs/survey.jsonl.gz: one JSON object (item) per line, blank lines "
            "skipped; gzip-compressed when it ends in .gz (or its bytes start with the gzip magic)."
        ),
    )
    bucket: str | None = Field(
        default=None,
        min_length=3,
        max_length=63,
        pattern=BUCKET_PATTERN,
        description="Bucket of the object. Default: the campaign's result store bucket.",
    )


def parse_item_line(line: str, number: int, where: str) -> Item | None:
    """One JSONL line as an item (None for a blank line); ValueError naming `where` and the line
    (ItemsOverLimit for a line too long or nested too deep)."""
    if not line.strip():
        return None
    if len(line) > MAX_ITEM_LINE_BYTES:  # characters: a bound below the bytes, checked cheaply
        raise line_too_long(where, number, None)
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{where} line {number}: not valid JSON ({error.msg}); write one JSON object per line"
        ) from None
    except RecursionError:
        raise _too_deep(where, number) from None
    if not isinstance(value, dict):
        raise ValueError(f"{where} line {number}: an item must be a JSON object, got {type(value).__name__}")
    if _depth(value) > MAX_ITEM_DEPTH:
        raise _too_deep(where, number)
    problem = item_source_problem(value)
    if problem is not None:
        raise ValueError(f"{where} line {number}: {problem}")
    return value


def line_too_long(where: str, number: int, index: int | None) -> ItemsOverLimit:
    """The line `number` (item `index`, when known) is longer than MAX_ITEM_LINE_BYTES."""
    item = "the item" if index is None else f"item {index}"
    return ItemsOverLimit(
        f"{where} line {number}",
        f"{item} alone is longer than one item may be",
        MAX_ITEM_LINE_BYTES,
        "an item is carried by its Shard: keep large payloads in object storage and pass their keys as items",
        unit=" bytes",
    )


def _too_deep(where: str, number: int) -> ItemsOverLimit:
    return ItemsOverLimit(
        f"{where} line {number}",
        "the item nests deeper than the levels of JSON an item may have",
        MAX_ITEM_DEPTH,
        "flatten the item",
    )


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, iteratively (bounded by the line's length)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_ITEM_DEPTH:
            return deepest
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def item_source_problem(item: Mapping[str, Any]) -> str | None:
    """Why an item's `source` key could not name the source of its Shard (ITEM_SOURCE_SCHEMA), or
    None. Checked on every input path, so a shard the API server would refuse is never cut."""
    if "source" not in item:
        return None
    source = item["source"]
    if not isinstance(source, str):
        return f"source must be a string (a source name), got {type(source).__name__}"
    if not 1 <= len(source) <= SOURCE_NAME_MAX or re.fullmatch(SOURCE_NAME_PATTERN, source) is None:
        shown = source if len(source) <= 80 else source[:80] + "..."
        return (
            f"source {shown!r} is not a source name: 1 to {SOURCE_NAME_MAX} letters, digits, '-', '_' "
            f"or '.', starting and ending with a letter or digit ({SOURCE_NAME_PATTERN})"
        )
    return None


def check_inline_items(items: Sequence[Item]) -> None:
    """ValueError naming the first inline item (spec.items[i]) whose source is refused: the CRD
    refuses it at admission, but a campaign stored under an older CRD may still hold one."""
    for index, item in enumerate(items):
        problem = item_source_problem(item)
        if problem is not None:
            raise ValueError(f"spec.items[{index}]: {problem}")


class ItemsFrom(SpecModel):
    """Where to read the campaign's items when they are too many to list inline: a ConfigMap key
    (at most 1 MiB in all) or an object in the S3 result store (any size, read as a stream)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(rules.ITEMS_FROM_ONE_SOURCE, rules.ITEMS_FROM_CONFIGMAP_KEY)
    )

    config_map_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of a ConfigMap in the campaign's namespace.",
    )
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=CONFIGMAP_KEY_PATTERN,
        description=(
            "Key in that ConfigMap whose value is JSONL: one JSON object (item) per line, "
            "blank lines skipped."
        ),
    )
    object: ItemsObject | None = Field(
        default=None,
        description=(
            "An object in the result store (S3) holding the items as JSONL, optionally gzip-compressed; "
            "kubectl campaign apply --items FILE uploads a local file and sets this."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> ItemsFrom:
        if (self.object is not None) == (self.config_map_name is not None or self.key is not None):
            raise ValueError(rules.ITEMS_FROM_ONE_SOURCE.message)
        if (self.config_map_name is None) != (self.key is None):
            raise ValueError(rules.ITEMS_FROM_CONFIGMAP_KEY.message)
        return self

    def describe(self) -> str:
        if self.object is not None:
            return f"object {self.object.key}" + (
                f" in bucket {self.object.bucket}" if self.object.bucket else ""
            )
        return f"ConfigMap {self.config_map_name} key {self.key}"

    def parse_items(self, text: str) -> list[Item]:
        """The items in the ConfigMap value `text` (JSONL).

        Raises ValueError naming the ConfigMap, key and line, so the operator can put the reason
        on the campaign's Invalid condition as is.
        """
        where = f"ConfigMap {self.config_map_name} key {self.key}"
        items: list[Item] = []
        for number, line in enumerate(text.splitlines(), start=1):
            item = parse_item_line(line, number, where)
            if item is None:
                continue
            if len(items) >= MAX_CONFIGMAP_ITEMS:  # the value itself is bounded: 1 MiB a ConfigMap
                raise ItemsOverLimit(
                    f"{where} line {number}",
                    "more items than one ConfigMap may hold",
                    MAX_CONFIGMAP_ITEMS,
                    "upload the items as an object (kubectl campaign apply --items FILE) instead",
                )
            items.append(item)
        return items


class ItemsPin(StatusModel):
    """What spec.itemsFrom held when the operator first read it: a later read that finds other
    content is refused (its shards were cut, and their results keyed, from this content)."""

    source: str = Field(max_length=2048, description="The input, as spec.itemsFrom names it.")
    etag: str | None = Field(
        default=None, max_length=1024, description="The object's ETag (itemsFrom.object)."
    )
    uid: str | None = Field(default=None, max_length=128, description="The ConfigMap's uid.")
    resource_version: str | None = Field(
        default=None, max_length=128, description="The ConfigMap's resourceVersion when it was read."
    )
    sha256: str | None = Field(
        default=None, max_length=64, description="SHA-256 of the ConfigMap key's value, what is compared."
    )

    def differs(self, now: ItemsPin) -> bool:
        """True when `now` (a later read of the same input) holds other content than this pin."""
        if self.etag is not None and now.etag is not None:
            return self.etag != now.etag
        if self.sha256 is not None and now.sha256 is not None:
            return self.sha256 != now.sha256
        return False

    def describe(self) -> str:
        if self.etag is not None:
            return f"ETag {self.etag}"
        return f"SHA-256 {(self.sha256 or '')[:12]}, resourceVersion {self.resource_version}"
