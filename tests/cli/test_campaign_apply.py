"""kubectl campaign apply --items FILE: the local file is checked before anything is uploaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardops.cli.campaign_apply import check_items
from shardops.cli.campaign_client import CliError
from shardops.logic.shard_items import MAX_SHARD_ITEMS_BYTES


def _file(tmp_path: Path, items: list[object]) -> Path:
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def test_items_are_counted_and_a_line_that_is_not_an_object_uploads_nothing(tmp_path: Path) -> None:
    assert check_items(_file(tmp_path, [{"n": 1}, {"n": 2}]), 10) == 2
    with pytest.raises(CliError, match=r"line 2: an item must be a JSON object.*nothing was uploaded"):
        check_items(_file(tmp_path, [{"n": 1}, [2]]), 10)


def test_a_shard_too_big_for_its_object_at_the_manifests_shard_size_uploads_nothing(tmp_path: Path) -> None:
    third = {"pad": "x" * (MAX_SHARD_ITEMS_BYTES // 3)}
    path = _file(tmp_path, [third] * 4)
    assert check_items(path, 2) == 4, "two a shard fit"
    with pytest.raises(
        CliError, match=r"shard 0 pass 1,048,576 bytes .*lower spec.shardSize.*nothing was uploaded"
    ):
        check_items(path, 4)
