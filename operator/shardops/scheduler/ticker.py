"""The periodic reconcile: every Campaign the operator serves is reconciled at least once per tick,
whether or not anything changed (leases run out, backoffs end, cooldowns pass without an event).

Why not `@kopf.timer`: kopf gives every object with a timer or a daemon its finalizer, always (both
register with `requires_finalizer=True`, whatever `optional=` says; kopf issue #1074). With one,
deleting a Campaign, or the namespace holding it, waits for a running operator to remove it: after
`helm uninstall`, or with the operator down, the delete hangs. Nothing needs that finalizer: the
garbage collector removes what a Campaign owns (Shards, their Leases, worker Jobs) through owner
references, and stored results are meant to outlive it. So the tick is the operator's own loop,
which kopf knows nothing about, and no handler asks kopf for a finalizer
(tests/scheduler/test_main.py checks every one).

It keeps what the kopf timer did: one asyncio task per Campaign, started when the watch first shows
the Campaign; each round waits `interval`, then runs `kick` in the same thread pool as kopf's sync
handlers and waits for it, so one Campaign never has two ticks in flight and the interval counts
from the end of the last pass (kopf's non-sharp timer). A failed pass is logged and the next tick
tries again. The index of Campaigns is fed by the watch kopf already runs (the `campaign-index`
handler): an entry goes when the watch says the Campaign was deleted or is being deleted, or when
a pass finds it gone (a deletion the watch missed while it was re-listing).

Cost: one task and one entry per Campaign served (not per shard); an idle tick is a sleep.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

log = logging.getLogger(__name__)

CampaignKey = tuple[str, str]
Kick = Callable[[str, str], bool]
Sleep = Callable[[float], Awaitable[None]]
Outcome = Callable[[str], None]


class CampaignTicker:
    def __init__(
        self,
        kick: Kick,
        interval: float,
        executor: Executor,
        *,
        sleep: Sleep = asyncio.sleep,
        outcome: Outcome = lambda _: None,
    ) -> None:
        """`kick(namespace, name)` reconciles one Campaign and returns False when it is gone;
        `outcome` is told "ok", "gone" or "error" after each periodic pass (a metric)."""
        self.kick = kick
        self.interval = interval
        self.executor = executor
        self.sleep = sleep
        self.outcome = outcome
        self._tasks: dict[CampaignKey, asyncio.Task[None]] = {}

    def known(self) -> set[CampaignKey]:
        return set(self._tasks)

    def seen(self, namespace: str, name: str, *, gone: bool) -> None:
        """A watch event of a Campaign (on the event loop): start its tick, or stop it when gone."""
        key = (namespace, name)
        if gone:
            self.forget(key)
        elif key not in self._tasks:
            self._tasks[key] = asyncio.get_running_loop().create_task(
                self._tick(key), name=f"tick {namespace}/{name}"
            )

    def forget(self, key: CampaignKey) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            # A pass already running in the pool finishes; only the waiting for it ends.
            task.cancel()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _tick(self, key: CampaignKey) -> None:
        loop = asyncio.get_running_loop()
        namespace, name = key
        while True:
            await self.sleep(self.interval)
            try:
                live = await loop.run_in_executor(self.executor, self.kick, namespace, name)
            except Exception:
                log.exception("periodic reconcile of campaign %s/%s failed; the next tick retries", *key)
                self.outcome("error")
                continue
            if not live:
                self.outcome("gone")
                if self._tasks.get(key) is asyncio.current_task():
                    del self._tasks[key]
                return
            self.outcome("ok")
