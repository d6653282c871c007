"""Crash points for the fault-injection tests: `SHARDOPS_FAILPOINT=<name>` makes the operator kill
itself (SIGKILL, no cleanup) when it reaches the named point, to prove every sequence of writes is
crash-safe there. With `SHARDOPS_FAILPOINT_MARKER=<file>` it does so once: the file is created
before the kill, and a restarted operator that finds it goes on. Unset in production: each check
is one environment lookup."""

from __future__ import annotations

import os
import signal
from pathlib import Path

ENV = "SHARDOPS_FAILPOINT"
MARKER_ENV = "SHARDOPS_FAILPOINT_MARKER"
# After the fold's ledger segment and status write, before its Shards are deleted.
FOLD_RECORDED = "fold-recorded"


def hit(name: str) -> None:
    if os.environ.get(ENV) != name:
        return
    marker = os.environ.get(MARKER_ENV)
    if marker:
        path = Path(marker)
        if path.exists():
            return
        path.write_text(name)
    os.kill(os.getpid(), signal.SIGKILL)
