"""The slots of one worker process (spec.worker.slots): what they share (`SlotGroup`) and running
their loops side by side (`run_slots`, one thread each). Each slot's loop is a runtime.Worker."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from shardops.store import ResultStore
from shardops.worker.metrics import WorkerMetrics

log = logging.getLogger("shardops.worker")


class SlotLoop(Protocol):
    """What `run_slots` needs of a slot (runtime.Worker)."""

    @property
    def holder(self) -> str: ...
    @property
    def stop(self) -> threading.Event: ...

    def run(self) -> int: ...


class SlotGroup:
    """What the slots of one worker process share: its metrics, its result stores (one S3 client per
    location), the claims it lost, won or is making, a lock that lets one slot at a time observe and
    choose, and how many slots are running a shard.

    One slot at a time chooses, so slots never race each other for a shard: a slot records the
    shard it chose at the version it saw as reserved (with the lost and won ones) before it lets the
    lock go and creates the Lease, and a sibling, whose watched copy has not seen that claim yet,
    passes it by instead of losing a Lease create to it; the Lease creates of the slots overlap.
    Bounded by the window: the lost and taken claims are pruned to the shards an observation sees.

    The pod leaves as a whole: once a slot leaves (idle, done, the campaign gone), `leaving` is set
    and every other slot leaves at its next turn, after its current shard, instead of claiming
    more; so the operator, which counts a Job's slots until the Job ends, never counts slots that
    are gone while the pod runs on with fewer."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.claiming = threading.Lock()
        self._lock = threading.Lock()
        self._stores: dict[str, ResultStore] = {}
        # Shard name -> (the version it was lost or taken at, monotonic time).
        self._lost: dict[str, tuple[str, float]] = {}
        self._running = 0
        self.leaving = threading.Event()

    def store(self, key: str, open_it: Callable[[], ResultStore]) -> ResultStore:
        """The store of `key`, opened once (outside the lock: opening may read credentials)."""
        with self._lock:
            found = self._stores.get(key)
        if found is not None:
            return found
        opened = open_it()
        with self._lock:
            return self._stores.setdefault(key, opened)

    def lose(self, name: str, version: str, at: float) -> None:
        with self._lock:
            self._lost[name] = (version, at)

    def lost(self, name: str) -> tuple[str, float] | None:
        with self._lock:
            return self._lost.get(name)

    def keep_only(self, present: set[str]) -> None:
        with self._lock:
            if len(self._lost) > len(present):
                self._lost = {name: lost for name, lost in self._lost.items() if name in present}

    def hold(self, holding: bool) -> None:
        """A slot won a shard's Lease (True) or is done with that shard (False)."""
        with self._lock:
            self._running += 1 if holding else -1

    @property
    def busy(self) -> bool:
        """A slot holds a shard (from its Lease won to its outcome): the process is not idle,
        whatever the other slots found."""
        with self._lock:
            return self._running > 0


class Held:
    """A lock taken now, released once (by whichever comes first: a won Lease, or the end of the
    observation)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._held = True
        lock.acquire()

    def release(self) -> None:
        if self._held:
            self._held = False
            self._lock.release()


def run_slots(slots: Sequence[SlotLoop]) -> int:
    """Run each slot's loop in a thread of its own until all have exited; slot 0 runs in the calling
    thread, so a worker of one slot runs as it always did. The exit code: 1 when a slot ended on a
    fatal error (which also stops the others, gracefully: their shards are released), else 0. A
    slot's commands are started and ended by its own thread (the parent-death signal follows the
    thread that started a process: `runner.spawn`)."""
    codes = [0] * len(slots)

    def run(index: int) -> None:
        slot = slots[index]
        try:
            codes[index] = slot.run()
        except BaseException:
            log.exception("slot %d of %s failed", index, slot.holder)
            codes[index] = 1
        if codes[index] != 0:
            slot.stop.set()

    threads = [
        threading.Thread(target=run, args=(index,), name=f"slot-{index}", daemon=True)
        for index in range(1, len(slots))
    ]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    return max(codes, default=0)
