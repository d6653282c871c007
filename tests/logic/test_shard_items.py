"""How many bytes of items a Shard carries: the check that runs over a campaign's input."""

from __future__ import annotations

import pytest

from shardops.logic.shard_items import (
    MAX_SHARD_ITEMS_BYTES,
    ShardItemsSize,
    ShardItemsTooLarge,
    check_shard_items,
    item_bytes,
)


def test_an_item_is_measured_as_stored_compact_utf8() -> None:
    assert item_bytes({"a": 1}) == len('{"a":1}')
    assert item_bytes({"t": "中"}) == len('{"t":"中"}'.encode()), "UTF-8, not \\u escapes"


def test_shards_that_fit_pass_and_each_shard_starts_from_zero() -> None:
    half = {"pad": "x" * (MAX_SHARD_ITEMS_BYTES // 2 - 20)}
    # Two halves per shard fit; four items are two shards, each within the limit.
    check_shard_items([half] * 4, 2, "spec.items")


def test_a_shard_over_the_limit_names_the_shard_the_item_and_a_shard_size_that_fits() -> None:
    over_half = {"pad": "x" * (MAX_SHARD_ITEMS_BYTES // 2 + 10)}
    with pytest.raises(ShardItemsTooLarge) as raised:
        check_shard_items([{"n": 0}, {"n": 1}, over_half, over_half], 2, "s3://b/k")
    assert "s3://b/k: the items of shard 1 pass 1,048,576 bytes at item 3" in str(raised.value)
    assert "about 1 items of this size fit" in str(raised.value)
    third = {"pad": "x" * (MAX_SHARD_ITEMS_BYTES // 3)}
    with pytest.raises(ShardItemsTooLarge) as raised:
        check_shard_items([third] * 4, 4, "s3://b/k")
    assert "shard 0 pass 1,048,576 bytes at item 2" in str(raised.value), "three thirds and their keys"
    assert "about 2 items of this size fit" in str(raised.value)


def test_one_item_over_the_limit_says_to_keep_payloads_elsewhere() -> None:
    sizes = ShardItemsSize(shard_size=10, where="ConfigMap q")
    sizes.add({"n": 0})
    with pytest.raises(
        ShardItemsTooLarge, match=r"item 1 alone is .* bytes: keep large payloads in object storage"
    ):
        sizes.add({"blob": "h" * (MAX_SHARD_ITEMS_BYTES + 1)})
