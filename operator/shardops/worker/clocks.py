"""The two clocks a worker reads: the wall clock (`shardops.clock.utcnow`, shifted only for fault
injection: `ClockSkewSettings.wall_clock`) and the monotonic one, on which every expiry is judged.
Tests pass a clock of their own."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shardops.clock import utcnow


class Clock(Protocol):
    def now(self) -> dt.datetime: ...
    def monotonic(self) -> float: ...


@dataclass
class SystemClock:
    # The wall clock (`ClockSkewSettings.wall_clock` shifts it for fault injection).
    wall: Callable[[], dt.datetime] = utcnow

    def now(self) -> dt.datetime:
        return self.wall()

    def monotonic(self) -> float:
        return time.monotonic()
