"""The operator folds shard history into the breakers by per-shard sequence, never by time.

Workers write their transitions with their own clocks; one whose clock lags by 30 s writes entries
older than what the operator already folded. Which entries are new is decided by each shard's
sequence against `status.historyFolded`, so such an entry is folded (once), also across a failover
(a new leader starts with nothing in memory), a status write that loses, and histories past
HISTORY_LIMIT. Workers act here through `k8s.shards.apply_transition`, as the worker runtime does,
with their clock set apart from the operator's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardops.api.enums import StoreType
from shardops.api.shard import HISTORY_LIMIT, Shard, ShardError, ShardResult
from shardops.api.store import ResultStoreStatus, resolve_result_store
from shardops.k8s.api import SHARDS, ApiError
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.logic.transitions import Action
from shardops.scheduler.reconcile import CONFLICT_ROUNDS, Reconciler
from shardops.store.s3 import S3Store
from tests.fakes3 import FakeS3
from tests.schedulerkit import (
    NAMESPACE,
    T0,
    Clock,
    OperatorKube,
    campaign,
    conflict_status_writes,
    entry,
    fail_status_writes,
    put_campaign,
    put_shard,
    reconciler,
    shard,
    shard_of,
    status_of,
)

CAMPAIGN = f"{NAMESPACE}/camp"
SOURCES = [{"name": "A", "cooldownSeconds": 600}]
LAGGING = -30.0


def _name(index: int | str) -> str:
    return index if isinstance(index, str) else f"camp-{index:05d}"


@dataclass
class Run:
    """A campaign of one-item shards calling source A, its operator (the latest leader), and the
    worker entries written so far (to check that each is folded exactly once)."""

    kube: OperatorKube
    clock: Clock
    operators: list[Reconciler] = field(default_factory=list)
    written: Counter[str] = field(default_factory=Counter)
    overrides: dict[str, object] = field(default_factory=dict)

    @classmethod
    def start(
        cls, shards: int = 3, threshold: int = 3, spec: dict[str, object] | None = None, **overrides: object
    ) -> Run:
        run = cls(OperatorKube(), Clock(), overrides=dict(overrides))
        store = resolve_result_store(None, run.settings_location())
        sources = [{**SOURCES[0], "breakerThreshold": threshold}]
        body = campaign(
            items=[{"id": i, "source": "A"} for i in range(shards)],
            sources=sources,
            maxAttempts=20,
            **(spec or {}),
        )
        put_campaign(run.kube, {**body, "status": {"resultStore": store.to_dict()}})
        run.failover()
        return run

    def settings_location(self) -> ResultStoreStatus:
        return reconciler(self.kube, self.clock, **self.overrides).settings.result_store_location()

    @property
    def operator(self) -> Reconciler:
        return self.operators[-1]

    def failover(self) -> Reconciler:
        """A new leader: a new process, nothing in memory."""
        self.operators.append(reconciler(self.kube, self.clock, **self.overrides))
        return self.operator

    def reconcile(self, seconds: float = 1) -> None:
        self.clock.advance(seconds)
        self.operator.reconcile(NAMESPACE, "camp")

    def shard(self, index: int | str) -> Shard:
        return Shard.parse(shard_of(self.kube, _name(index)))

    def _worker(self, skew: float) -> tuple[Actor, dt.datetime]:
        return Actor(controller="shardops-worker", instance=f"w{skew:+.0f}"), self.clock.now + dt.timedelta(
            seconds=skew
        )

    def claim(self, index: int | str, skew: float, seconds: float = 1) -> Shard:
        self.clock.advance(seconds)
        actor, now = self._worker(skew)
        current = self.shard(index)
        attempt = current.current_status.attempt + (1 if self._claimed_before(current) else 0)
        request = TransitionRequest(
            Action.CLAIM,
            "claimed",
            updates={"owner": actor.instance, "lease_until": now + dt.timedelta(seconds=30), "source": "A"},
            attempt=attempt,
        )
        self.written["Claimed"] += 1
        return apply_transition(self.kube, current, request, actor, now)

    @staticmethod
    def _claimed_before(shard_: Shard) -> bool:
        """A claim after an attempt (the entries may be gone past HISTORY_LIMIT) starts the next one."""
        status = shard_.current_status
        return status.attempt > 1 or any(e.reason == "Claimed" for e in status.history)

    def fail(self, index: int | str, skew: float, cls: str = "rate-limited", seconds: float = 1) -> None:
        """A worker whose clock is `skew` seconds off the operator's claims the shard and fails."""
        claimed = self.claim(index, skew, seconds)
        actor, now = self._worker(skew)
        error = ShardError.model_validate({"class": cls, "source": "A", "message": "429", "at": now})
        request = TransitionRequest(
            Action.FAIL_RETRYABLE,
            f"{cls}: 429",
            updates={"owner": None, "lease_until": None, "last_error": error},
        )
        apply_transition(self.kube, claimed, request, actor, now)
        self.written[f"AttemptFailed/{cls}"] += 1

    def release(self, index: int | str, skew: float, seconds: float = 1) -> None:
        """A worker claims the shard and is shut down (SIGTERM): Released, no attempt charged."""
        claimed = self.claim(index, skew, seconds)
        actor, now = self._worker(skew)
        request = TransitionRequest(Action.RELEASE, "shutdown", updates={"owner": None, "lease_until": None})
        apply_transition(self.kube, claimed, request, actor, now)

    def complete(self, index: int | str, skew: float, seconds: float = 1) -> None:
        claimed = self.claim(index, skew, seconds)
        actor, now = self._worker(skew)
        result = ShardResult(ref=f"attempts/{index}", fingerprint="sha256:" + "0" * 64, bytes=2)
        request = TransitionRequest(Action.COMPLETE, "done", updates={"result": result, "owner": None})
        apply_transition(self.kube, claimed, request, actor, now)

    def counted(self, metric: str, **labels: str) -> float:
        """What every leader so far counted, summed: each entry must be counted by exactly one."""
        return sum(
            o.metrics.registry.get_sample_value(metric, {"campaign": CAMPAIGN, **labels}) or 0.0
            for o in self.operators
        )

    def counted_failures(self, cls: str) -> float:
        return self.counted("shardops_retries_total", error_class=cls)

    def breaker(self) -> dict:
        return next(b for b in status_of(self.kube).get("breakers") or [] if b["source"] == "A")

    def folded_map(self) -> dict[str, int]:
        return dict(status_of(self.kube).get("historyFolded") or {})

    def last_sequences(self) -> dict[str, int]:
        return {
            s["metadata"]["name"]: Shard.parse(s).current_status.last_sequence
            for s in self.kube.list(SHARDS, NAMESPACE)
        }

    def assert_each_entry_folded_once(self) -> None:
        assert self.counted("shardops_claims_total") == self.written["Claimed"]
        for cls in ("rate-limited", "timeout"):
            assert self.counted_failures(cls) == self.written[f"AttemptFailed/{cls}"], cls
        assert self.folded_map() == self.last_sequences()


# --- the defect: a lagging clock ------------------------------------------------------------------------


@pytest.mark.parametrize("failover", [False, True], ids=["same-leader", "new-leader"])
def test_a_failure_written_by_a_lagging_clock_after_the_fold_moved_on_opens_the_breaker(
    failover: bool,
) -> None:
    run = Run.start()
    run.reconcile()  # materializes the three shards
    run.fail(0, 0, seconds=10)
    run.fail(1, 0, seconds=10)
    # A worker on time claims shard 2 and is shut down: shard 2 has entries as new as the others'.
    run.release(2, 0, seconds=5)
    run.reconcile()
    assert run.breaker()["consecutiveFailures"] == 2 and run.breaker()["state"] == "Closed"
    if failover:
        run.failover()
    # Ten seconds later a worker whose clock is 30 s behind claims shard 2 and is rate limited: its
    # entries are older than every entry already folded, shard 2's own included.
    run.fail(2, LAGGING, seconds=10)
    failure = run.shard(2).current_status.history[-1]
    assert failure.at < min(run.shard(i).current_status.history[-1].at for i in (0, 1))
    run.reconcile()
    breaker = run.breaker()
    assert breaker["state"] == "Open" and breaker["consecutiveFailures"] == 3, breaker
    assert "camp-00002" in breaker["reason"]
    assert run.kube.event_reasons("camp").count("BreakerOpened") == 1
    assert run.folded_map()[_name(2)] == failure.sequence == run.shard(2).current_status.last_sequence
    run.reconcile()
    assert run.breaker()["consecutiveFailures"] == 3, "folded once"
    run.assert_each_entry_folded_once()


def test_a_new_leader_folds_every_entry_exactly_once() -> None:
    run = Run.start(threshold=10)
    run.reconcile()
    run.fail(0, 0)
    run.fail(1, +30)  # a clock ahead moves the old watermark far forward
    run.reconcile()
    first = run.folded_map()
    run.fail(2, LAGGING)
    run.fail(0, LAGGING)
    # The leader goes before folding them; the new one has only the status to go by.
    run.failover()
    run.reconcile()
    assert run.counted_failures("rate-limited") == 4
    assert run.breaker()["consecutiveFailures"] == 4
    assert run.folded_map()[_name(1)] == first[_name(1)], "nothing new on shard 1"
    # And a third leader, with nothing new written, folds nothing again.
    run.failover()
    run.reconcile()
    assert run.counted_failures("rate-limited") == 4 and run.breaker()["consecutiveFailures"] == 4
    run.assert_each_entry_folded_once()


@pytest.mark.parametrize("lost", [1, CONFLICT_ROUNDS], ids=["retried-in-the-pass", "left-to-the-next-leader"])
def test_a_status_write_that_conflicts_loses_nothing_and_counts_nothing_twice(lost: int) -> None:
    run = Run.start()
    run.reconcile()
    run.fail(0, 0, seconds=20)
    run.fail(1, 0)
    run.reconcile()
    run.fail(2, LAGGING)
    made_to_lose = conflict_status_writes(run.kube, lost)
    run.reconcile()
    assert len(made_to_lose) == lost
    if lost == CONFLICT_ROUNDS:
        # Every round lost: the status is as before, nothing counted, nothing announced.
        assert run.breaker()["consecutiveFailures"] == 2 and run.counted_failures("rate-limited") == 2
        assert "BreakerOpened" not in run.kube.event_reasons("camp")
        run.failover()
        run.reconcile()
    assert run.breaker()["state"] == "Open" and run.breaker()["consecutiveFailures"] == 3
    assert run.kube.event_reasons("camp").count("BreakerOpened") == 1
    run.reconcile()
    run.assert_each_entry_folded_once()


def test_a_status_write_that_errors_leaves_the_sequences_where_they_were() -> None:
    run = Run.start()
    run.reconcile()
    before = run.folded_map()
    run.fail(0, LAGGING, seconds=5)

    fail_status_writes(run.kube, "etcd is down")
    with pytest.raises(ApiError):
        run.reconcile()
    run.kube.before.clear()
    assert run.folded_map() == before
    run.failover()
    run.reconcile()
    run.assert_each_entry_folded_once()


def test_histories_past_the_limit_fold_each_entry_once() -> None:
    """Sequences are not list positions: a shard with more transitions than HISTORY_LIMIT keeps
    folding its new entries (the oldest dropped), across leaders and lagging clocks."""
    run = Run.start(shards=1)
    run.reconcile()
    for round_ in range(4):
        for n in range(4):
            skew = LAGGING if (round_ + n) % 2 else 0.0
            run.fail(0, skew, cls="timeout" if n == 3 else "rate-limited", seconds=10)
        if round_ == 2:
            run.failover()
        run.reconcile()
    status = run.shard(0).current_status
    assert len(status.history) == HISTORY_LIMIT and status.last_sequence == 1 + 4 * 4 * 2
    assert run.folded_map() == {_name(0): 33}
    run.assert_each_entry_folded_once()


# --- the map follows the live shards -------------------------------------------------------------------


def test_shards_folded_into_the_ledger_leave_the_map() -> None:
    run = Run.start(shards=3, result_store=StoreType.S3, s3_bucket="results")
    location = run.settings_location()
    run.operator.stores.use(NAMESPACE, location, S3Store(location, NAMESPACE, client=FakeS3()))
    run.reconcile()
    assert set(run.folded_map()) == {_name(0), _name(1), _name(2)}
    run.fail(0, 0)
    run.complete(0, LAGGING)
    run.complete(1, 0)
    run.reconcile()
    # Folded into the ledger and deleted in that same write: their entries were folded first.
    assert status_of(run.kube)["folded"]["shards"] == 2
    assert run.kube.obj(SHARDS, NAMESPACE, _name(0)) is None
    assert run.folded_map() == {_name(2): 1}, "the stored map dropped them (sent as null)"
    assert run.counted_failures("rate-limited") == 1 and run.counted("shardops_claims_total") == 3


def test_a_shard_deleted_and_cut_again_under_its_name_folds_from_its_own_first_entry() -> None:
    """The finalize shard, deleted by hand after it failed twice, is cut again under the same name:
    the sequence recorded for the old object says nothing about the new one's entries."""
    run = Run.start(shards=1, threshold=10, spec={"finalize": {"image": "img", "command": ["merge"]}})
    run.reconcile()
    run.complete(0, 0)
    run.reconcile()
    run.fail("camp-finalize", 0)
    run.fail("camp-finalize", LAGGING)
    run.reconcile()
    assert run.folded_map()["camp-finalize"] == 5
    run.kube.delete(SHARDS, NAMESPACE, "camp-finalize")
    run.reconcile()
    assert run.shard("camp-finalize").current_status.sequences() == [1]
    assert run.folded_map()["camp-finalize"] == 1
    run.fail("camp-finalize", LAGGING)
    run.fail("camp-finalize", 0)
    run.reconcile()
    assert run.folded_map()["camp-finalize"] == 5
    assert run.breaker()["consecutiveFailures"] == 4
    run.assert_each_entry_folded_once()


# --- upgrade from the time rule -------------------------------------------------------------------------


def test_an_operator_upgraded_mid_campaign_takes_the_old_watermark_once() -> None:
    """A status an earlier release wrote: historyFoldedUntil, no historyFolded, entries without a
    sequence. The entries up to the watermark were folded by that release and are not folded again;
    those after it are, and from then on each shard's sequence decides."""
    kube, clock = OperatorKube(), Clock(T0 + dt.timedelta(seconds=100))
    store = resolve_result_store(None, reconciler(kube, clock).settings.result_store_location())

    def at(seconds: float) -> dt.datetime:
        return T0 + dt.timedelta(seconds=seconds)

    def attempt(t: float) -> list[dict]:
        return [
            entry("Running", at(t - 1), "Claimed", source="A"),
            entry("Pending", at(t), "AttemptFailed", source="A", errorClass="rate-limited"),
        ]

    status = {
        "resultStore": store.to_dict(),
        "historyFoldedUntil": at(50).isoformat(),
        "breakers": [{"source": "A", "state": "Closed", "consecutiveFailures": 2}],
    }
    body = campaign(items=[{"id": i, "source": "A"} for i in range(3)], sources=SOURCES, maxAttempts=20)
    put_campaign(kube, {**body, "status": status})
    materialized = [entry("Pending", T0, "Materialized")]
    put_shard(kube, shard("camp", 0, "Pending", attempt=2, history=[*materialized, *attempt(40)]))
    put_shard(kube, shard("camp", 1, "Pending", attempt=2, history=[*materialized, *attempt(45)]))
    put_shard(kube, shard("camp", 2, "Pending", attempt=2, history=[*materialized, *attempt(60)]))
    operator = reconciler(kube, clock)
    operator.reconcile(NAMESPACE, "camp")
    stored = status_of(kube)
    assert stored["historyFolded"] == {_name(0): 3, _name(1): 3, _name(2): 3}
    breaker = next(b for b in stored["breakers"] if b["source"] == "A")
    assert breaker["consecutiveFailures"] == 3 and breaker["state"] == "Open", "only shard 2's failure is new"
    assert stored["historyFoldedUntil"] == at(60).isoformat().replace("+00:00", "Z")
    # A worker of this release whose clock lags writes a failure before the old watermark: folded.
    lagging = Actor(controller="shardops-worker", instance="w")
    current = Shard.parse(shard_of(kube, _name(0)))
    claimed = apply_transition(
        kube,
        current,
        TransitionRequest(Action.CLAIM, "claimed", updates={"owner": "w", "source": "A"}, attempt=3),
        lagging,
        at(30),
    )
    error = ShardError.model_validate({"class": "timeout", "source": "A", "message": "slow", "at": at(31)})
    apply_transition(
        kube,
        claimed,
        TransitionRequest(Action.FAIL_RETRYABLE, "timeout", updates={"owner": None, "last_error": error}),
        lagging,
        at(31),
    )
    assert Shard.parse(shard_of(kube, _name(0))).current_status.sequences() == [1, 2, 3, 4, 5]
    successor = reconciler(kube, clock.advance(5))
    successor.reconcile(NAMESPACE, "camp")
    assert status_of(kube)["historyFolded"][_name(0)] == 5
    timeouts = successor.metrics.registry.get_sample_value(
        "shardops_retries_total", {"campaign": CAMPAIGN, "error_class": "timeout"}
    )
    assert timeouts == 1
    rate_limited = successor.metrics.registry.get_sample_value(
        "shardops_retries_total", {"campaign": CAMPAIGN, "error_class": "rate-limited"}
    )
    assert not rate_limited, "nothing folded twice"


# --- the property: any interleaving folds each entry once ------------------------------------------------

_SKEWS = st.sampled_from([-30.0, -5.0, 0.0, 12.0, 30.0])
_STEPS = st.one_of(
    st.tuples(st.just("fail"), st.integers(0, 2), _SKEWS, st.sampled_from(["rate-limited", "timeout"])),
    st.tuples(st.just("release"), st.integers(0, 2), _SKEWS, st.just("")),
    st.tuples(st.just("reconcile"), st.just(0), st.just(0.0), st.just("")),
    st.tuples(st.just("failover"), st.just(0), st.just(0.0), st.just("")),
    st.tuples(st.just("conflict"), st.integers(1, CONFLICT_ROUNDS), st.just(0.0), st.just("")),
    st.tuples(st.just("error"), st.just(0), st.just(0.0), st.just("")),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_STEPS, max_size=40))
def test_any_interleaving_of_writers_leaders_and_lost_writes_folds_each_entry_once(
    steps: list[tuple[str, int, float, str]],
) -> None:
    run = Run.start()
    run.reconcile()
    # Entries written since the last committed fold, per shard: a shard may not write more than the
    # history keeps before the operator reads it (the entries dropped unread are lost to anyone).
    unread = Counter[int]()
    for kind, number, skew, cls in steps:
        if kind in ("fail", "release"):
            if unread[number] + 2 > HISTORY_LIMIT - 2:
                run.reconcile()
                unread.clear()
            if kind == "fail":
                run.fail(number, skew, cls)
            else:
                run.release(number, skew)
            unread[number] += 2
        elif kind == "reconcile":
            run.reconcile()
            unread.clear()
        elif kind == "failover":
            run.failover()
        elif kind == "conflict":
            conflict_status_writes(run.kube, number)
            run.reconcile()
            run.kube.before.clear()
            if number < CONFLICT_ROUNDS:
                unread.clear()
        else:
            fail_status_writes(run.kube, "the write never lands")
            # Raises when the pass had a status to write (nothing new: no write, nothing to lose).
            with contextlib.suppress(ApiError):
                run.reconcile()
            run.kube.before.clear()
    run.reconcile()
    run.assert_each_entry_folded_once()
