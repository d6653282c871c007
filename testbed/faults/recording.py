"""Reading the local control plane's audit log: the whole of it, or one test's part — the lines
written after a byte offset taken when the test started, in its namespace. The e2e session's
cluster records history bodies (e2e/conftest.py), so these entries make a History
(testbed/faults/history.py)."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from testbed.faults.history import History, from_entries


def read_entries(
    path: Path, namespaces: Collection[str] | None = None, offset: int = 0
) -> Iterator[dict[str, Any]]:
    """The entries about objects in `namespaces` (all when None) from byte `offset` on. A last line
    still being written (no newline yet) is left out: the API server writes each entry as one line."""
    needles = [f'"namespace":"{namespace}"' for namespace in namespaces or ()]
    with path.open("rb") as handle:
        handle.seek(offset)
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            line = raw.decode(errors="replace")
            if needles and not any(needle in line for needle in needles):
                continue
            entry = json.loads(line)
            if namespaces is None or (entry.get("objectRef") or {}).get("namespace") in namespaces:
                yield entry


class AuditTail:
    """The audit log `path` from its size at construction on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def history(self, namespace: str) -> History:
        """What was written in `namespace` since the offset."""
        return from_entries(read_entries(self.path, [namespace], self.offset))
