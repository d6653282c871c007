"""An upload checked in chunks: a duplicate custom_id found across chunks and past the in-memory
limit, naming both lines; the spool and the duplicate check's file deleted on close."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testbed.upstream import batch_line, chat_body

from shardops.batchapi import files
from shardops.batchapi.objects import ApiProblem
from shardops.store import inputs


def _file(count: int, repeat: tuple[int, int] | None = None) -> bytes:
    """`count` batch lines; with `repeat` (line, earlier line) that line has the earlier one's custom_id."""
    lines = []
    for number in range(1, count + 1):
        custom_id = f"task-{repeat[1] if repeat and number == repeat[0] else number}"
        lines.append(json.dumps(batch_line(custom_id, chat_body(f"question {number}", model="m"))))
    return ("\n".join(lines) + "\n").encode()


def _feed(upload: files.Upload, data: bytes, chunk: int = 97) -> None:
    """In chunks of an odd size, so lines straddle them."""
    for start in range(0, len(data), chunk):
        upload.feed(data[start : start + chunk])
    upload.finish()


@pytest.fixture(autouse=True)
def small_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inputs, "CUSTOM_IDS_IN_MEMORY", 8)


def test_a_duplicate_across_chunks_and_the_spill_names_both_lines(tmp_path: Path) -> None:
    upload = files.Upload("requests.jsonl", 50, str(tmp_path))
    try:
        with pytest.raises(ApiProblem) as refused:
            _feed(upload, _file(40, repeat=(33, 4)))
        assert any(path.name.startswith("custom-ids-") for path in tmp_path.iterdir()), "past the limit"
    finally:
        upload.close()
    assert refused.value.status == 400
    assert refused.value.message == (
        "requests.jsonl line 33: custom_id 'task-4' is already the custom_id of line 4; "
        "each request needs its own"
    )
    assert list(tmp_path.iterdir()) == [], "the spool and the duplicate check's file are deleted"


def test_a_clean_upload_spools_every_byte_and_leaves_nothing_behind(tmp_path: Path) -> None:
    data = _file(40)
    upload = files.Upload("requests.jsonl", 50, str(tmp_path))
    try:
        _feed(upload, data)
        assert upload.check.items == 40 and upload.spool.read() == data
    finally:
        upload.close()
    assert list(tmp_path.iterdir()) == []
