from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardops.api.enums import BreakerState, ShardClass, ShardPhase
from shardops.logic.backpressure import (
    WorkerFailures,
    backlog_bound,
    backlog_room,
    cluster_full,
    slots_to_start,
    worker_jobs,
)
from shardops.logic.breaker import Route, SourceBreaker
from shardops.logic.budget import BudgetGate
from shardops.logic.planner import DispatchInputs, LimitReason, claim_order_key, plan_dispatch
from shardops.logic.shardview import ShardView
from tests.logickit import NOW, budget_at, inputs, shard

P = ShardPhase
FIN = ShardClass.FINALIZE
OPEN_A = {"a": SourceBreaker(BreakerState.OPEN, 3, NOW - timedelta(minutes=1))}
WARN = budget_at(85.0, 100.0, 0.8)
EXHAUSTED = budget_at(100.0, 100.0, 0.8)


def pending(count: int, source: str | None = None) -> list[ShardView]:
    return [shard(f"p{i}", P.PENDING, source=source) for i in range(count)]


def running(count: int) -> list[ShardView]:
    return [shard(f"r{i}", P.RUNNING) for i in range(count)]


# --- backpressure rules -------------------------------------------------------------------------


def test_backlog_bound_is_ratio_times_running_with_a_floor_of_one() -> None:
    assert backlog_bound(5, 0) == 5
    assert backlog_bound(5, 4) == 20
    assert backlog_bound(0.29, 100) == 29
    assert backlog_room(22, 5, 4) == 0


def test_cluster_full_when_stuck_pods_reach_running_pods() -> None:
    assert cluster_full(1, 0)
    assert not cluster_full(0, 0)
    assert not cluster_full(1, 4)
    assert cluster_full(4, 4)


def test_workers_never_exceed_what_can_be_claimed() -> None:
    assert slots_to_start(6, claimable=4, running=2, alive_slots=2) == 4
    assert slots_to_start(6, claimable=4, running=2, alive_slots=3) == 3
    assert slots_to_start(6, claimable=0, running=3, alive_slots=1) == 0
    assert slots_to_start(6, claimable=10, running=0, alive_slots=0) == 6


def test_slots_start_in_full_jobs_and_the_last_one_takes_the_rest() -> None:
    assert worker_jobs(20, 8) == (8, 8, 4)
    assert worker_jobs(16, 8) == (8, 8)
    assert worker_jobs(3, 1) == (1, 1, 1)
    assert worker_jobs(0, 8) == () and worker_jobs(-2, 8) == ()
    with pytest.raises(ValueError, match="at least 1"):
        worker_jobs(4, 0)


def test_the_planner_counts_the_slots_of_alive_jobs_not_the_jobs() -> None:
    """maxConcurrency 20 at 8 slots a pod: three Jobs (8, 8, 4) from nothing; one alive Job of 8
    slots leaves 12 to start (8, 4), not 19 Jobs; alive slots at the cap start none."""
    assert plan_dispatch(
        inputs(pending(20), max_concurrency=20, slots_per_worker=8, alive_jobs=0)
    ).start_workers == (
        8,
        8,
        4,
    )
    one = inputs(pending(20), max_concurrency=20, slots_per_worker=8, alive_jobs=1, alive_slots=8)
    assert plan_dispatch(one).start_workers == (8, 4)
    full = inputs(pending(20), max_concurrency=20, slots_per_worker=8, alive_jobs=3, alive_slots=20)
    assert plan_dispatch(full).start_workers == ()
    # Only 2 claimable: a Job of 2 slots, not of 8.
    two = inputs(pending(2), max_concurrency=20, slots_per_worker=8, alive_jobs=0)
    assert plan_dispatch(two).start_workers == (2,)


# --- planner ------------------------------------------------------------------------------------


def test_claims_up_to_max_concurrency_and_starts_workers() -> None:
    plan = plan_dispatch(inputs([*running(2), *pending(10)]))
    assert plan.claimable == ("p0", "p1", "p2", "p3")
    assert len(plan.start_workers) == 4
    assert plan.reason is LimitReason.CAPACITY
    assert "6 ready shard(s) wait" in plan.message
    assert plan.skipped["p9"].startswith("ready; waits for a free slot")


def test_priority_first_then_fifo() -> None:
    shards = [
        shard("late-high", index=9, priority=5),
        shard("early-low", index=1),
        shard("early-high", index=2, priority=5),
        shard("mid-low", index=4),
    ]
    plan = plan_dispatch(inputs(shards))
    assert plan.claimable == ("early-high", "late-high", "early-low", "mid-low")
    assert plan.reason is LimitReason.NONE


def test_idle_workers_count_toward_the_pool() -> None:
    plan = plan_dispatch(inputs([*running(2), *pending(2)], alive_jobs=3))
    assert len(plan.start_workers) == 1


def test_materializes_only_up_to_the_backlog_bound() -> None:
    plan = plan_dispatch(inputs([*running(1), *pending(3)], total_items=1000, cut_items=40))
    assert plan.materialize == 2
    assert plan.reason is LimitReason.BACKPRESSURE
    assert (
        "pending 3 of bound 5 (backlogRatio 5 * max(running 1, 1)): holding back 94 shard(s)" in plan.message
    )


def test_materializes_no_more_than_remains() -> None:
    plan = plan_dispatch(inputs([], total_items=25, cut_items=0, shard_size=10))
    assert plan.materialize == 3
    assert plan.reason is LimitReason.NOTHING_READY


def test_backlog_at_the_bound_stops_materialization() -> None:
    plan = plan_dispatch(inputs([*running(4), *pending(20)], total_items=100, max_concurrency=4))
    assert plan.materialize == 0
    assert plan.claimable == ()
    backpressure = next(limit for limit in plan.limits if limit.reason is LimitReason.BACKPRESSURE)
    assert backpressure.message.startswith("pending 20 of bound 20 (backlogRatio 5 * max(running 4, 1))")


def test_queued_shards_are_promoted_before_new_ones_are_cut() -> None:
    queued = [shard(f"q{i}", P.QUEUED) for i in range(3)]
    plan = plan_dispatch(inputs([*pending(3), *queued], total_items=100))
    assert plan.promote == ("q0", "q1")
    assert plan.materialize == 0
    assert plan.skipped["q0"].startswith("materializing now")
    assert plan.skipped["q2"].startswith("queued: pending 3 of bound 5")


def test_backoff_shards_are_skipped_with_their_time() -> None:
    later = NOW + timedelta(seconds=30)
    plan = plan_dispatch(inputs([shard("p0", not_before=later), shard("p1", not_before=NOW)]))
    assert plan.claimable == ("p1",)
    assert plan.skipped["p0"] == "backoff until 2025-01-01T12:00:30Z (30s)"


def test_only_backoff_left_is_nothing_ready() -> None:
    plan = plan_dispatch(inputs([shard("p0", not_before=NOW + timedelta(seconds=5))]))
    assert plan.reason is LimitReason.NOTHING_READY
    assert "backoff until" in plan.message
    assert plan_dispatch(inputs([])).message == "nothing left to dispatch"


def test_finalize_waits_for_every_work_shard_and_item() -> None:
    final = shard("final", shard_class=FIN, index=99)
    busy = plan_dispatch(inputs([shard("w0", P.RUNNING), final]))
    assert busy.claimable == ()
    assert busy.skipped["final"] == "finalize waits for 1 unfinished work shard(s)"
    more_items = plan_dispatch(inputs([shard("w0", P.DONE), final], total_items=20, cut_items=10))
    assert "final" not in more_items.claimable
    done = plan_dispatch(inputs([shard("w0", P.DONE), shard("w1", P.BLOCKED), final]))
    assert done.claimable == ("final",)


def test_budget_warn_lets_only_finalize_start_and_cuts_no_new_shards() -> None:
    shards = [shard("w0", P.DONE), shard("w1", P.FAILED), shard("final", shard_class=FIN)]
    plan = plan_dispatch(inputs(shards, budget=WARN))
    assert plan.claimable == ("final",)
    blocked = plan_dispatch(
        inputs([*pending(2), shard("final", shard_class=FIN)], budget=WARN, total_items=50)
    )
    assert blocked.claimable == ()
    assert blocked.materialize == 0
    assert blocked.reason is LimitReason.BUDGET
    assert "only finalize shards start" in blocked.skipped["p0"]
    assert "spent 85 of 100 (85%)" in blocked.message


def test_budget_exhausted_pauses_unclaimed_and_lets_running_finish() -> None:
    shards = [*running(2), *pending(2), shard("q0", P.QUEUED), shard("final", shard_class=FIN)]
    plan = plan_dispatch(inputs(shards, budget=EXHAUSTED, total_items=100))
    assert set(plan.pause) == {"p0", "p1", "q0", "final"}
    assert plan.claimable == () and plan.materialize == 0 and len(plan.start_workers) == 0
    assert plan.reason is LimitReason.BUDGET
    assert "4 unclaimed shard(s) pause, 2 running finish" in plan.message


def test_paused_shards_resume_when_the_gate_reopens() -> None:
    shards = [shard("x0", P.PAUSED), shard("x1", P.PAUSED)]
    assert plan_dispatch(inputs(shards, budget=EXHAUSTED)).resume == ()
    assert (
        plan_dispatch(inputs(shards, budget=EXHAUSTED)).skipped["x0"].startswith("paused: budget exhausted")
    )
    plan = plan_dispatch(inputs(shards, budget=budget_at(100.0, 200.0, 0.8)))
    assert plan.resume == ("x0", "x1")
    assert plan.skipped["x0"].startswith("resuming now")


def test_shards_resumed_in_a_pass_count_against_the_backlog_bound_of_that_pass() -> None:
    """The budget raised after a hold: 12 Paused shards go back to Pending in this pass. With nothing
    running the bound is 5 (ratio 5 * max(0, 1)): nothing more may be cut or promoted (the fault
    suite's backlog-bound check found 5 cut on top of the 12)."""
    shards = [shard(f"x{i}", P.PAUSED, index=i) for i in range(12)] + [shard("q0", P.QUEUED, index=12)]
    plan = plan_dispatch(inputs(shards, budget=budget_at(100.0, 200.0, 0.8), total_items=100))
    assert len(plan.resume) == 12
    assert (plan.materialize, plan.promote) == (0, ())
    few = [shard("x0", P.PAUSED, index=0), shard("q0", P.QUEUED, index=1)]
    plan = plan_dispatch(inputs(few, budget=budget_at(100.0, 200.0, 0.8), total_items=100))
    assert plan.resume == ("x0",) and plan.promote == ("q0",) and plan.materialize == 3


def test_suspended_starts_nothing_and_loses_nothing() -> None:
    shards = [*running(1), *pending(3), shard("q0", P.QUEUED), shard("x0", P.PAUSED)]
    plan = plan_dispatch(inputs(shards, suspended=True, total_items=100))
    assert (plan.claimable, plan.materialize, plan.start_workers, plan.promote) == ((), 0, (), ())
    assert set(plan.pause) == {"p0", "p1", "p2", "q0"}
    assert plan.resume == ()
    assert plan.reason is LimitReason.SUSPENDED
    unsuspended = plan_dispatch(inputs([shard(n, P.PAUSED) for n in plan.pause]))
    assert set(unsuspended.resume) == set(plan.pause)


def test_open_breaker_holds_its_source_and_others_go_on() -> None:
    shards = [shard("a0", source="a", index=0), shard("b1", source="b", index=1)]
    plan = plan_dispatch(inputs(shards, breakers=OPEN_A))
    assert plan.claimable == ("b1",)
    assert plan.skipped["a0"] == "breaker: a open until 2025-01-01T12:04:00Z"
    assert plan.routes["b1"] == Route("b", probe=False)
    held = plan_dispatch(inputs(shards[:1], breakers=OPEN_A))
    assert held.reason is LimitReason.BREAKER


def test_open_breaker_routes_to_the_fallback() -> None:
    plan = plan_dispatch(inputs([shard("a0", source="a")], breakers=OPEN_A, fallbacks={"a": "b"}))
    assert plan.claimable == ("a0",)
    assert plan.routes["a0"] == Route("b", probe=False)


def test_half_open_lets_exactly_one_probe_through() -> None:
    after_cooldown = NOW + timedelta(minutes=10)
    shards = [shard(f"a{i}", source="a") for i in range(3)]
    plan = plan_dispatch(inputs(shards, breakers=OPEN_A, now=after_cooldown))
    assert plan.claimable == ("a0",)
    assert plan.routes["a0"] == Route("a", probe=True)
    assert "probe in flight" in plan.skipped["a1"]
    in_flight = [shard("r0", P.RUNNING, source="a"), *shards]
    assert plan_dispatch(inputs(in_flight, breakers=OPEN_A, now=after_cooldown)).claimable == ()


def test_stuck_pending_pods_stop_new_jobs_but_not_claims() -> None:
    plan = plan_dispatch(inputs(pending(3), alive_jobs=2, running_pods=0, stuck_pending_pods=2))
    assert len(plan.start_workers) == 0
    assert plan.claimable == ("p0", "p1", "p2")
    assert plan.reason is LimitReason.CLUSTER_FULL
    assert "2 worker pod(s) stuck Pending ≥ max(1, running pods 0)" in plan.message
    partly = plan_dispatch(inputs([*running(4), *pending(2)], stuck_pending_pods=1))
    assert len(partly.start_workers) == 2


def test_failing_workers_hold_new_jobs_in_the_plan_itself() -> None:
    """The hold is the planner's decision, so `kubectl campaign plan` says it as the operator acts on it."""
    failing = WorkerFailures(
        count=3, last_at=NOW - timedelta(seconds=5), last_reason="w-2: BackoffLimitExceeded"
    )
    plan = plan_dispatch(inputs(pending(3), max_concurrency=3, alive_jobs=0, recent_failures=failing))
    assert len(plan.start_workers) == 0
    assert plan.claimable == ("p0", "p1", "p2"), "claims by running workers go on"
    assert plan.reason is LimitReason.WORKERS_FAILING
    assert "3 worker Job(s) failed in the last 5m (last: w-2: BackoffLimitExceeded)" in plan.message
    quiet = plan_dispatch(
        inputs(
            pending(3),
            max_concurrency=3,
            alive_jobs=0,
            recent_failures=failing,
            now=NOW + timedelta(seconds=60),
        )
    )
    assert len(quiet.start_workers) == 3 and quiet.reason is not LimitReason.WORKERS_FAILING
    few = WorkerFailures(count=3, last_at=NOW, last_reason="x")
    assert (
        plan_dispatch(inputs(pending(6), max_concurrency=6, alive_jobs=0, recent_failures=few)).start_workers
        == (1,) * 6
    )
    # With 8 slots a pod, a cap of 64 runs in 8 Jobs: 8 failed Jobs are a wave of them, not 64.
    wave = WorkerFailures(count=8, last_at=NOW, last_reason="x")
    slotted = inputs(pending(6), max_concurrency=64, slots_per_worker=8, alive_jobs=0, recent_failures=wave)
    assert plan_dispatch(slotted).reason is LimitReason.WORKERS_FAILING
    fewer = WorkerFailures(count=7, last_at=NOW, last_reason="x")
    slotted = inputs(pending(6), max_concurrency=64, slots_per_worker=8, alive_jobs=0, recent_failures=fewer)
    assert plan_dispatch(slotted).start_workers == (6,)


def test_concurrency_cut_below_running_claims_nothing() -> None:
    plan = plan_dispatch(inputs([*running(5), *pending(2)], max_concurrency=3))
    assert plan.claimable == () and len(plan.start_workers) == 0
    assert plan.reason is LimitReason.CAPACITY


def test_plan_is_json_ready() -> None:
    plan = plan_dispatch(inputs(pending(2, source="a"), breakers=OPEN_A, fallbacks={"a": "b"}))
    data = json.loads(json.dumps(plan.as_dict()))
    assert data["routes"]["p0"] == {"source": "b", "probe": False}
    assert data["reason"] == "None"


# --- properties ---------------------------------------------------------------------------------

SOURCES = ["a", "b", None]


NOT_BEFORE = st.sampled_from([None, NOW - timedelta(1), NOW + timedelta(1)])
SHARD_FIELDS = st.tuples(
    st.sampled_from(ShardPhase),
    st.sampled_from(ShardClass),
    st.integers(0, 3),
    st.integers(1, 3),
    st.sampled_from(SOURCES),
    NOT_BEFORE,
)


@st.composite
def shard_views(draw: st.DrawFn) -> list[ShardView]:
    fields = draw(st.lists(SHARD_FIELDS, max_size=25))
    # Creation order is a permutation, so FIFO is checked against an order unrelated to the names.
    order = draw(st.permutations(range(len(fields))))
    return [
        ShardView(f"s{i}", phase, cls, priority, order[i], attempt, source, not_before, NOW, 0.0)
        for i, (phase, cls, priority, attempt, source, not_before) in enumerate(fields)
    ]


@st.composite
def dispatch_inputs(draw: st.DrawFn) -> DispatchInputs:
    breaker = st.sampled_from(
        [
            SourceBreaker(BreakerState.CLOSED, 0, None),
            SourceBreaker(BreakerState.OPEN, 3, NOW),
            SourceBreaker(BreakerState.OPEN, 3, NOW - timedelta(hours=1)),
        ]
    )
    total = draw(st.integers(0, 500))
    return inputs(
        draw(shard_views()),
        max_concurrency=draw(st.integers(0, 8)),
        backlog_ratio=draw(st.sampled_from([0.5, 1, 2.5, 5])),
        total_items=total,
        cut_items=draw(st.integers(0, total)),
        shard_size=draw(st.integers(1, 20)),
        breakers=draw(st.dictionaries(st.sampled_from(["a", "b"]), breaker)),
        fallbacks=draw(st.sampled_from([{}, {"a": "b"}, {"a": "b", "b": "a"}])),
        budget=budget_at(draw(st.sampled_from([0.0, 85.0, 100.0])), 100.0, 0.8),
        suspended=draw(st.booleans()),
        alive_jobs=draw(st.integers(0, 10)),
        alive_slots=draw(st.integers(0, 20)),
        slots_per_worker=draw(st.sampled_from([1, 1, 3, 8])),
        running_pods=draw(st.integers(0, 10)),
        stuck_pending_pods=draw(st.integers(0, 3)),
    )


PROPERTY = settings(max_examples=200, deadline=None)


def _by_name(data: DispatchInputs) -> dict[str, ShardView]:
    return {s.name: s for s in data.shards}


@PROPERTY
@given(dispatch_inputs())
def test_never_exceeds_max_concurrency(data: DispatchInputs) -> None:
    plan = plan_dispatch(data)
    running = sum(1 for s in data.shards if s.phase is P.RUNNING)
    limit = data.limits.max_concurrency
    assert len(plan.claimable) <= max(0, limit - running)
    slots = sum(plan.start_workers)
    assert slots <= max(0, limit - data.workers.alive_slots)
    assert all(1 <= job <= data.limits.slots_per_worker for job in plan.start_workers)
    queued = sum(1 for s in data.shards if s.phase is P.QUEUED)
    assert slots <= len(plan.claimable) + data.items.uncut_shards + queued
    if data.items.uncut_shards == 0 and queued == 0:
        assert slots <= len(plan.claimable)


@PROPERTY
@given(dispatch_inputs())
def test_never_materializes_past_the_ratio_bound(data: DispatchInputs) -> None:
    plan = plan_dispatch(data)
    pending_now = sum(1 for s in data.shards if s.phase is P.PENDING)
    running = sum(1 for s in data.shards if s.phase is P.RUNNING)
    room = backlog_room(pending_now, data.limits.backlog_ratio, running)
    assert 0 <= plan.materialize <= data.items.uncut_shards
    assert plan.materialize + len(plan.promote) <= room


@PROPERTY
@given(dispatch_inputs())
def test_claim_order_is_priority_then_fifo(data: DispatchInputs) -> None:
    plan = plan_dispatch(data)
    views = _by_name(data)
    keys = [claim_order_key(views[name]) for name in plan.claimable]
    assert keys == sorted(keys)


@PROPERTY
@given(dispatch_inputs())
def test_no_work_shard_claimable_at_budget_warn(data: DispatchInputs) -> None:
    plan = plan_dispatch(data)
    views = _by_name(data)
    if data.budget.gate is not BudgetGate.OPEN:
        assert all(views[name].shard_class is FIN for name in plan.claimable)
        assert plan.materialize == 0
    if data.budget.gate is BudgetGate.EXHAUSTED or data.suspended:
        assert plan.claimable == () and plan.promote == () and len(plan.start_workers) == 0


@PROPERTY
@given(dispatch_inputs())
def test_every_waiting_shard_is_claimable_or_explained(data: DispatchInputs) -> None:
    plan = plan_dispatch(data)
    views = _by_name(data)
    waiting = {s.name for s in data.shards if s.phase in {P.PENDING, P.QUEUED, P.PAUSED}}
    assert set(plan.claimable) | set(plan.skipped) == waiting
    assert not set(plan.claimable) & set(plan.skipped)
    assert not set(plan.pause) & set(plan.resume)
    for name in plan.claimable:
        view = views[name]
        assert view.phase is P.PENDING
        assert view.not_before is None or view.not_before <= data.now
    assert plan.reason is (plan.limits[0].reason if plan.limits else LimitReason.NONE)


@PROPERTY
@given(dispatch_inputs())
def test_at_most_one_probe_per_source(data: DispatchInputs) -> None:
    plan = plan_dispatch(data)
    probes = [r.source for r in plan.routes.values() if r.probe]
    assert len(probes) == len(set(probes))
    running_sources = {s.source for s in data.shards if s.phase is P.RUNNING}
    assert not set(probes) & running_sources


def test_workers_start_for_work_the_backlog_bound_keeps_uncut() -> None:
    """A new campaign of 200 shards at maxConcurrency 20: the bound lets 5 be cut while nothing runs,
    and the 20 workers start at once, ready when the rest is cut."""
    fresh = plan_dispatch(inputs([], max_concurrency=20, total_items=200, shard_size=1, alive_jobs=0))
    assert fresh.materialize == 5 and fresh.claimable == ()
    assert len(fresh.start_workers) == 20
    some = plan_dispatch(inputs(pending(5), max_concurrency=20, total_items=200, cut_items=5, shard_size=1))
    assert len(some.start_workers) == 20
    # Nothing more coming: as many as there is to claim.
    last = plan_dispatch(inputs(pending(3), max_concurrency=20, total_items=3, cut_items=3, shard_size=1))
    assert len(last.start_workers) == 3


def test_no_workers_start_for_uncut_work_while_something_else_holds_work_back() -> None:
    broken = plan_dispatch(
        inputs(
            pending(2, source="a"),
            max_concurrency=20,
            total_items=200,
            cut_items=2,
            shard_size=1,
            breakers=OPEN_A,
        )
    )
    assert broken.claimable == () and len(broken.start_workers) == 0
    suspended = plan_dispatch(inputs([], max_concurrency=20, total_items=200, shard_size=1, suspended=True))
    assert len(suspended.start_workers) == 0
    warn = plan_dispatch(
        inputs([], max_concurrency=20, total_items=200, shard_size=1, budget=budget_at(0.9, 1.0, 0.8))
    )
    assert len(warn.start_workers) == 0


def test_a_worker_that_cannot_start_holds_new_jobs_and_says_why() -> None:
    base = inputs(pending(3), alive_jobs=1, running_pods=0)
    problem = 'pod w-1-x: container worker: CreateContainerConfigError: secret "s3" not found'
    held = replace(base, workers=replace(base.workers, cannot_start=problem))
    plan = plan_dispatch(held)
    assert plan.reason is LimitReason.WORKERS_FAILING and plan.start_workers == ()
    assert problem in plan.message
    # Said even when no Job is wanted: the only worker is not healthy.
    idle = replace(held, limits=replace(held.limits, max_concurrency=1))
    assert plan_dispatch(idle).reason is LimitReason.WORKERS_FAILING


def test_an_unschedulable_worker_is_a_full_cluster_even_when_no_job_is_wanted() -> None:
    base = inputs(pending(1), max_concurrency=1, alive_jobs=1, running_pods=0, stuck_pending_pods=1)
    assert plan_dispatch(base).reason is not LimitReason.CLUSTER_FULL, "no word why: as before"
    said = "pod w-1-x: Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."
    plan = plan_dispatch(replace(base, workers=replace(base.workers, stuck_detail=said)))
    assert plan.reason is LimitReason.CLUSTER_FULL and said in plan.message


def _queued(inputs_: DispatchInputs, **counts: object) -> DispatchInputs:
    return replace(inputs_, workers=replace(inputs_.workers, **counts))


def test_a_job_kueue_holds_waits_for_quota_and_starts_no_other() -> None:
    """Kueue's suspended worker Job has no pod: waiting for quota, not a full cluster or a failure."""
    held = _queued(
        inputs(pending(3), alive_jobs=2, running_pods=1),
        queued_jobs=1,
        queue_wait="1 worker Job(s) wait for quota in LocalQueue team-a: Kueue: insufficient quota",
    )
    plan = plan_dispatch(held)
    assert len(plan.start_workers) == 0
    assert plan.claimable == ("p0", "p1", "p2"), "the admitted worker goes on claiming"
    assert plan.reason is LimitReason.WAITING_FOR_QUOTA
    assert "wait for quota in LocalQueue team-a: Kueue: insufficient quota" in plan.message
    assert {limit.reason for limit in plan.limits}.isdisjoint(
        {LimitReason.CLUSTER_FULL, LimitReason.WORKERS_FAILING}
    )
    admitted = plan_dispatch(inputs(pending(3), alive_jobs=1, running_pods=1))
    assert len(admitted.start_workers) == 2, "once admitted (no Job held), Jobs start again"


def test_a_queue_that_does_not_exist_comes_before_waiting_for_quota() -> None:
    missing = _queued(
        inputs(pending(2), alive_jobs=1, running_pods=0),
        queued_jobs=1,
        queue_wait="1 worker Job(s) wait for quota in LocalQueue nope",
        queue_missing="spec.worker.queueName nope: no LocalQueue nope in this namespace",
    )
    plan = plan_dispatch(missing)
    assert plan.reason is LimitReason.QUEUE_NOT_FOUND and len(plan.start_workers) == 0
    assert plan.message.startswith("spec.worker.queueName nope: no LocalQueue nope")


def test_a_source_that_does_not_serve_the_campaign_starts_no_worker_and_says_the_fix() -> None:
    fix = "spec.sources[0].sourceRef: no Source team in namespace a: create it"
    held = replace(inputs(pending(2), alive_jobs=0, running_pods=0), source_unresolved=fix)
    plan = plan_dispatch(held)
    assert plan.reason is LimitReason.SOURCE_UNRESOLVED and len(plan.start_workers) == 0
    assert plan.message.startswith(fix)
