"""The periodic reconcile: one tick per Campaign after every interval, never two in flight, ended
by the watch (deleted, being deleted) or by a pass that finds the Campaign gone."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from shardops.scheduler.ticker import CampaignTicker


class Intervals:
    """An injected sleep: every call waits until the test lets one interval pass."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self._passed = asyncio.Semaphore(0)

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        await self._passed.acquire()

    def pass_one(self) -> None:
        self._passed.release()


class Kicks:
    """The reconcile the ticker calls (in its thread pool): records calls, answers from `results`."""

    def __init__(self, *results: bool | Exception) -> None:
        self.calls: list[tuple[str, str]] = []
        self.results = list(results)
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, namespace: str, name: str) -> bool:
        self.calls.append((namespace, name))
        self.gate.wait(10)
        result = self.results.pop(0) if self.results else True
        if isinstance(result, Exception):
            raise result
        return result


async def until(what: str, probe: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll `probe` on the loop (letting the ticker's tasks and the pool run) until it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not probe():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


Body = Callable[[CampaignTicker, Intervals, Kicks, list[str]], Awaitable[None]]


def run(body: Body, kicks: Kicks) -> None:
    """`body(ticker, intervals, kicks, outcomes)` on a fresh loop, with a 7 s interval and a real pool."""

    async def main() -> None:
        intervals = Intervals()
        outcomes: list[str] = []
        with ThreadPoolExecutor(max_workers=4) as pool:
            ticker = CampaignTicker(kicks, 7.0, pool, sleep=intervals, outcome=outcomes.append)
            try:
                await body(ticker, intervals, kicks, outcomes)
            finally:
                kicks.gate.set()
                await ticker.stop()

    asyncio.run(main())


def ticks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("tick ") and not t.done()]


def test_a_campaign_is_reconciled_after_every_interval_until_the_watch_says_deleted() -> None:
    async def body(ticker: CampaignTicker, intervals: Intervals, kicks: Kicks, outcomes: list[str]) -> None:
        ticker.seen("ns", "a", gone=False)
        ticker.seen("ns", "a", gone=False)  # every later event of the same Campaign: still one tick
        await until("the first interval to start", lambda: intervals.asked == [7.0])
        assert kicks.calls == [], "the change handlers reconcile a new Campaign; the tick waits first"

        def progress() -> tuple[int, int]:
            return len(kicks.calls), len(intervals.asked)

        for passes in (1, 2, 3):
            intervals.pass_one()
            # After each pass the tick is waiting for its next interval again.
            await until(f"pass {passes}", lambda want=(passes, passes + 1): progress() == want)
        assert kicks.calls == [("ns", "a")] * 3 and outcomes == ["ok"] * 3
        assert ticker.known() == {("ns", "a")} and len(ticks()) == 1
        ticker.seen("ns", "a", gone=True)
        assert ticker.known() == set()
        await until("its tick to end", lambda: ticks() == [])
        assert len(kicks.calls) == 3

    run(body, Kicks())


def test_a_pass_that_finds_the_campaign_gone_ends_its_tick() -> None:
    async def body(ticker: CampaignTicker, intervals: Intervals, kicks: Kicks, outcomes: list[str]) -> None:
        ticker.seen("ns", "missed-delete", gone=False)
        intervals.pass_one()
        intervals.pass_one()
        await until("the second pass", lambda: outcomes == ["ok", "gone"])
        assert ticker.known() == set() and kicks.calls == [("ns", "missed-delete")] * 2
        await until("its tick to end", lambda: ticks() == [])
        ticker.seen("ns", "missed-delete", gone=False)  # created again under the same name
        assert ticker.known() == {("ns", "missed-delete")} and len(ticks()) == 1

    run(body, Kicks(True, False))


def test_a_failed_pass_is_logged_and_the_next_tick_tries_again(caplog: pytest.LogCaptureFixture) -> None:
    async def body(ticker: CampaignTicker, intervals: Intervals, kicks: Kicks, outcomes: list[str]) -> None:
        ticker.seen("ns", "a", gone=False)
        intervals.pass_one()
        await until("the failed pass", lambda: outcomes == ["error"])
        intervals.pass_one()
        await until("the next pass", lambda: outcomes == ["error", "ok"])
        assert ticker.known() == {("ns", "a")}

    with caplog.at_level(logging.ERROR, logger="shardops.scheduler.ticker"):
        run(body, Kicks(RuntimeError("API server unreachable"), True))
    (record,) = caplog.records
    assert "campaign ns/a failed; the next tick retries" in record.getMessage()
    assert record.exc_info and "API server unreachable" in str(record.exc_info[1])


def test_a_slow_pass_holds_its_campaigns_tick_and_no_one_elses() -> None:
    async def body(ticker: CampaignTicker, intervals: Intervals, kicks: Kicks, outcomes: list[str]) -> None:
        kicks.gate.clear()  # every pass blocks until the test opens the gate
        ticker.seen("ns", "slow", gone=False)
        intervals.pass_one()
        await until("the slow pass to start", lambda: kicks.calls == [("ns", "slow")])
        ticker.seen("ns", "other", gone=False)
        await until("the other campaign's interval", lambda: len(intervals.asked) == 2)
        intervals.pass_one()
        await until("the other campaign's pass", lambda: ("ns", "other") in kicks.calls)
        # No second interval for the slow campaign: its tick waits for its pass to end.
        assert intervals.asked == [7.0, 7.0] and kicks.calls.count(("ns", "slow")) == 1
        kicks.gate.set()
        await until("both to wait for their next interval", lambda: len(intervals.asked) == 4)
        assert outcomes == ["ok", "ok"]

    run(body, Kicks())


def test_stop_ends_every_tick() -> None:
    async def body(ticker: CampaignTicker, intervals: Intervals, kicks: Kicks, outcomes: list[str]) -> None:
        for name in ("a", "b", "c"):
            ticker.seen("ns", name, gone=False)
        await until("three intervals", lambda: len(intervals.asked) == 3)
        assert len(ticks()) == 3
        await ticker.stop()
        assert ticker.known() == set() and ticks() == []

    run(body, Kicks())
