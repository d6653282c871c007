"""Items streamed from a JSONL object: counted and checked once, sliced in order through a cursor
(reopening only to go back), with the line-numbered errors of the ConfigMap path."""

from __future__ import annotations

import json

import pytest

from shardops.api.campaign import Campaign
from shardops.api.names import API_GROUP_VERSION
from shardops.logic.shard_items import MAX_SHARD_ITEMS_BYTES, ShardItemsTooLarge
from shardops.store.items import StreamedItems, campaign_items
from shardops.store.s3 import OpenedItems
from tests.fakekube import FakeKube


class Source:
    def __init__(self, lines: list[str], etag: str = '"v1"') -> None:
        self.lines, self.opened, self.etag = lines, 0, etag
        self.asked: list[str | None] = []

    def __call__(self, if_match: str | None) -> OpenedItems:
        self.opened += 1
        self.asked.append(if_match)
        return OpenedItems(iter(self.lines), self.etag)


def test_counts_once_and_slices_in_order_without_reopening() -> None:
    source = Source([f'{{"n": {i}}}\n' if i % 3 else "\n" for i in range(30)])
    items = StreamedItems(source, "s3://b/k")
    assert len(items) == 20 and source.opened == 1
    assert items[0:5] == [{"n": i} for i in (1, 2, 4, 5, 7)]
    assert items[5:8] == [{"n": i} for i in (8, 10, 11)]
    assert source.opened == 2, "consecutive slices continue one stream"
    assert items[1:2] == [{"n": 2}] and source.opened == 3, "going back reopens"
    assert items[18:40] == [{"n": 28}, {"n": 29}] and items[19] == {"n": 29}


def test_a_bad_line_is_named_with_its_number() -> None:
    items = StreamedItems(Source(['{"n": 1}\n', "[1]\n"]), "s3://b/k")
    with pytest.raises(ValueError, match=r"s3://b/k line 2: an item must be a JSON object, got list"):
        len(items)
    broken = StreamedItems(Source(['{"n": 1}\n', "\n", "{oops\n"]), "s3://b/k")
    with pytest.raises(ValueError, match="line 3: not valid JSON"):
        broken.total()


def test_counting_with_a_shard_size_checks_each_shard_fits_its_shard_object() -> None:
    blob = "h" * (MAX_SHARD_ITEMS_BYTES * 2 // 3)
    lines = ['{"n": 0}\n', json.dumps({"n": 1, "blob": blob}) + "\n", json.dumps({"n": 2, "blob": blob})]
    assert StreamedItems(Source(lines), "s3://b/k").total() == 3, "without a shard size: counted only"
    heavy = StreamedItems(Source(lines), "s3://b/k", shard_size=3)
    with pytest.raises(ShardItemsTooLarge, match=r"s3://b/k: the items of shard 0 .* lower spec.shardSize"):
        heavy.total()


def test_a_campaign_parsed_without_its_items_is_refused_not_read_as_empty() -> None:
    body = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Campaign",
        "metadata": {"name": "c"},
        "spec": {"items": [{"n": 1}], "worker": {"image": "i", "command": ["x"]}},
    }
    kube = FakeKube()
    assert campaign_items(kube, Campaign.parse(body), None) == [{"n": 1}]
    with pytest.raises(ValueError, match="parsed with its items"):
        campaign_items(kube, Campaign.parse_items_counted(body), None)
