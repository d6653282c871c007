"""kubectl campaign apply --items FILE: the local file is checked before anything is uploaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testbed.upstream import batch_line

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


def test_openai_batch_lines_are_checked_and_a_repeated_custom_id_names_both_lines(tmp_path: Path) -> None:
    def line(custom_id: str, url: str = "/v1/chat/completions") -> dict[str, object]:
        return batch_line(custom_id, {"model": "m"}, url)

    assert check_items(_file(tmp_path, [line("a"), line("b")]), 10, batch=True) == 2
    with pytest.raises(CliError, match=r"line 3: custom_id 'a' is already the custom_id of line 1"):
        check_items(_file(tmp_path, [line("a"), line("b"), line("a")]), 10, batch=True)
    with pytest.raises(CliError, match=r"line 2: url must be one of .*nothing was uploaded"):
        check_items(_file(tmp_path, [line("a"), line("b", url="/v1/images")]), 10, batch=True)
    assert check_items(_file(tmp_path, [line("a"), line("a")]), 10) == 2, "only a batch campaign's lines"
