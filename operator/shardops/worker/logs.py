"""The worker's structured log: one JSON line per event (main.JsonFormatter) through `emit`."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("shardops.worker")


def emit(event: str, **fields: Any) -> None:
    """A structured log line (see main.JsonFormatter): what happened, to which shard, with figures."""
    log.info(event, extra={"fields": {"event": event, **fields}})
