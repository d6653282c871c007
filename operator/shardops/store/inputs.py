"""An input file of items checked line by line as it streams by: the one check behind
`kubectl campaign apply --items` and the Batch API's file upload, with the operator's line-numbered
errors. The caller feeds the lines; the only thing written is the duplicate check's SQLite file in
the spool directory once a file's custom_ids outgrow memory (`SpillingFirstLines`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import tempfile
from types import TracebackType

from shardops.api.items import parse_item_line
from shardops.api.openai_batch import CustomIds
from shardops.logic.shard_items import ShardItemsSize

# The one home of "small input or large": up to this many custom_ids a file's duplicate check keeps
# them in a dict (~120 B each, so about 1.2 MB); past it they move to a SQLite file, so a file of any
# length is checked in bounded memory. Inline and ConfigMap items (at most 1 MiB) use the dict alone.
CUSTOM_IDS_IN_MEMORY = 10_000
# SQLite's page cache for that file (its pragma takes KiB when negative): what the check holds of the
# file in memory however many lines it has; the rest is on disk (and in the kernel's page cache).
SPILL_CACHE_KIB = 2048


class SpillingFirstLines:
    """The line each custom_id was first seen on: a dict up to `in_memory` ids, then a SQLite file in
    `spool_dir` (`close` deletes it). The file's key is the custom_id's sha256, not the id: 32 bytes
    a row whatever the id's length (up to 512 characters, 2 KiB of UTF-8), so the B-tree stays dense
    (~50 B a line on disk); two ids of one digest are as likely as a sha256 collision. The error names
    the id from the line at hand, so the file never needs the text. SQLite rather than a sorted
    external merge: one indexed lookup per line keeps the first duplicate's error on the line where it
    is read, as the in-memory check does, and sqlite3 is in the standard library."""

    def __init__(self, spool_dir: str | None = None, in_memory: int | None = None) -> None:
        self.spool_dir = spool_dir
        self.in_memory = CUSTOM_IDS_IN_MEMORY if in_memory is None else in_memory
        self.memory: dict[str, int] | None = {}  # None once spilled: bounded by `in_memory`
        self.path: str | None = None
        self._db: sqlite3.Connection | None = None

    def first_line(self, custom_id: str, number: int) -> int:
        if self.memory is not None:
            first = self.memory.setdefault(custom_id, number)
            if len(self.memory) > self.in_memory:
                self._spill(self.memory)
            return first
        assert self._db is not None
        digest = hashlib.sha256(custom_id.encode("utf-8")).digest()
        added = self._db.execute("INSERT OR IGNORE INTO first_lines VALUES (?, ?)", (digest, number))
        if added.rowcount == 1:
            return number
        row = self._db.execute("SELECT line FROM first_lines WHERE digest = ?", (digest,)).fetchone()
        return int(row[0])

    def _spill(self, memory: dict[str, int]) -> None:
        handle, self.path = tempfile.mkstemp(prefix="custom-ids-", suffix=".sqlite", dir=self.spool_dir)
        os.close(handle)
        # The upload's chunks are checked on whichever executor thread is free, one at a time.
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db = db
        # A scratch file deleted on close: no journal, no fsync, one transaction never committed
        # (SQLite writes pages past the cache into the file as it goes).
        db.execute("PRAGMA journal_mode = OFF")
        db.execute("PRAGMA synchronous = OFF")
        db.execute(f"PRAGMA cache_size = -{SPILL_CACHE_KIB}")
        db.execute("CREATE TABLE first_lines (digest BLOB PRIMARY KEY, line INTEGER NOT NULL) WITHOUT ROWID")
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO first_lines VALUES (?, ?)",
            (
                (hashlib.sha256(custom_id.encode("utf-8")).digest(), line)
                for custom_id, line in memory.items()
            ),
        )
        self.memory = None

    def close(self) -> None:
        """Delete the SQLite file, if the ids went there; the check answers nothing after."""
        if self._db is not None:
            self._db.close()
            self._db = None
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None
        self.memory = None


class InputCheck:
    """Every line a JSON object, every shard (`shard_size` items) small enough for its Shard, and with
    `batch` (llm format openai-batch) every line an OpenAI batch input line whose custom_id no earlier
    line has (kept as `SpillingFirstLines`, in `spool_dir`: memory flat in the file's lines). Close it
    (or use it as a context manager) to delete that file."""

    def __init__(self, where: str, shard_size: int, batch: bool, spool_dir: str | None = None) -> None:
        self.where = where
        self.items = 0
        self.lines = 0
        self._sizes = ShardItemsSize(shard_size, where)
        self._first_lines = SpillingFirstLines(spool_dir) if batch else None
        self._custom_ids = CustomIds(self._first_lines) if self._first_lines is not None else None

    def add(self, line: str) -> None:
        """The next line; ValueError naming the file and the line when it is wrong."""
        self.lines += 1
        item = parse_item_line(line, self.lines, self.where)
        if item is None:
            return
        if self._custom_ids is not None:
            self._custom_ids.check(item, self.lines, self.where)
        self._sizes.add(item)
        self.items += 1

    def close(self) -> None:
        if self._first_lines is not None:
            self._first_lines.close()

    def __enter__(self) -> InputCheck:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
