"""The input check's duplicate custom_ids: a dict for small inputs, a SQLite file in the spool
directory past CUSTOM_IDS_IN_MEMORY, the same answer either side, the file deleted on close, and the
Python heap flat however many ids go to the file."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from shardops.store.inputs import InputCheck, SpillingFirstLines


def _line(custom_id: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": {}}) + "\n"


def test_a_small_input_stays_in_memory_and_writes_nothing(tmp_path: Path) -> None:
    seen = SpillingFirstLines(str(tmp_path), in_memory=10)
    assert [seen.first_line(f"id-{n}", n) for n in range(1, 11)] == list(range(1, 11))
    assert seen.first_line("id-4", 11) == 4
    assert seen.memory is not None and list(tmp_path.iterdir()) == []
    seen.close()


def test_past_the_limit_the_ids_go_to_a_file_and_duplicates_are_found_on_both_sides(tmp_path: Path) -> None:
    seen = SpillingFirstLines(str(tmp_path), in_memory=10)
    for number in range(1, 31):
        assert seen.first_line(f"id-{number}", number) == number
    assert seen.memory is None, "the dict is dropped once the ids are in the file"
    assert [path.name for path in tmp_path.iterdir()] == [Path(str(seen.path)).name]
    assert seen.first_line("id-3", 31) == 3, "an id seen while in memory"
    assert seen.first_line("id-25", 32) == 25, "an id seen after the spill"
    assert seen.first_line("id-31", 33) == 33
    seen.close()
    assert list(tmp_path.iterdir()) == [], "close deletes the file"


def test_a_duplicate_across_the_spill_names_both_lines_and_close_deletes_the_file(tmp_path: Path) -> None:
    check = InputCheck("requests.jsonl", 100, batch=True, spool_dir=str(tmp_path))
    check._first_lines.in_memory = 5  # type: ignore[union-attr]
    with check, pytest.raises(ValueError) as refused:
        for number in range(1, 40):
            check.add(_line("task-2" if number == 37 else f"task-{number}"))
    assert str(refused.value) == (
        "requests.jsonl line 37: custom_id 'task-2' is already the custom_id of line 2; "
        "each request needs its own"
    )
    assert check.items == 36
    assert list(tmp_path.iterdir()) == []


def test_the_heap_stays_flat_however_many_ids_go_to_the_file(tmp_path: Path) -> None:
    """50,000 ids in a dict take megabytes (~120 B each); past the spill the Python heap does not
    grow with them (SQLite's own page cache is bounded by SPILL_CACHE_KIB, outside this count)."""
    seen = SpillingFirstLines(str(tmp_path), in_memory=1_000)
    for number in range(1, 1_002):
        seen.first_line(f"request-{number:012d}", number)
    assert seen.memory is None
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for number in range(1_002, 51_002):
            seen.first_line(f"request-{number:012d}", number)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 256 * 1024, f"the heap grew {after - before} bytes for 50,000 ids"
    assert seen.first_line("request-000000040000", 51_002) == 40_000
    seen.close()
    assert list(tmp_path.iterdir()) == []
