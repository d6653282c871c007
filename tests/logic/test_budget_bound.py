"""The budget bound: with maxPerShard a work shard starts only while its reservation fits the limit
next to the running shards' (logic.planner), and a campaign whose work the budget holds says so."""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardops.api.enums import ShardClass, ShardPhase
from shardops.logic.budget import (
    BudgetStatus,
    HoldCause,
    limit_to_start,
    reservation,
    reserved,
)
from shardops.logic.planner import LimitReason, plan_dispatch
from shardops.logic.shardview import ShardView
from tests.logickit import budget_at, inputs, money, shard

P = ShardPhase
FIN = ShardClass.FINALIZE
# Float sums of the same figures in another order differ in the last bits: a budget cannot tell.


def pending(count: int, start: int = 0) -> list[ShardView]:
    return [shard(f"p{i}", P.PENDING) for i in range(start, start + count)]


def running(*costs: float) -> list[ShardView]:
    return [shard(f"r{i}", P.RUNNING, cost=cost) for i, cost in enumerate(costs)]


# --- the reservation arithmetic -------------------------------------------------------------------


def test_a_shard_reserves_its_cap_less_what_it_reported() -> None:
    two = Decimal(2)
    assert reservation(two, Decimal(0)) == 2
    assert reservation(two, Decimal("1.5")) == Decimal("0.5")
    assert reservation(two, Decimal("2.5")) == 0, "past its cap it is being stopped: nothing more to reserve"
    assert reservation(None, Decimal(1)) == 0
    assert reserved(two, [Decimal(0), Decimal("0.5"), Decimal(3)]) == Decimal("3.5")


def test_the_limit_to_start_the_next_shard_reopens_the_gate_and_fits_its_reservation() -> None:
    warn = budget_at(85.0, 100.0, 0.8, 10.0)
    assert limit_to_start(warn, Decimal(0), Decimal(10)) == Decimal("106.25")  # 85 / 0.8, exactly
    assert limit_to_start(warn, Decimal(30), Decimal(10)) == 125  # 85 + 30 + 10
    assert limit_to_start(budget_at(85.0, 100.0, 0.8), Decimal(0), Decimal(0)) == Decimal("106.25")


# --- the planner ------------------------------------------------------------------------------------


def test_only_the_shards_whose_reservations_fit_together_are_claimable() -> None:
    # limit 10, spent 3 (2.5 done + 0.5 by the running shard), which reserves 1.5 more: 5.5 left,
    # room for two fresh shards of maxPerShard 2 however many workers are idle.
    shards = [shard("d0", P.DONE, cost=2.5), *running(0.5), *pending(5)]
    plan = plan_dispatch(inputs(shards, max_concurrency=6, budget=budget_at(3.0, 10.0, 0.8, 2.0)))
    assert plan.claimable == ("p0", "p1")
    assert len(plan.start_workers) == 2
    assert plan.skipped["p2"].startswith(
        "budget: needs 2 (maxPerShard 2 less its cost so far), 1.5 of limit 10"
    )
    assert plan.reason is LimitReason.BUDGET
    hold = plan.budget_hold
    assert hold is not None and hold.cause is HoldCause.NO_ROOM and hold.lifts_itself
    # The two claimable now hold their reservations too: 3 wait, 1.5 + 2 * 2 reserved, and the next
    # needs 2 more: 3 + 5.5 + 2.
    assert (hold.waiting, hold.running, hold.reserved, hold.next_needs) == (3, 3, 5.5, 2.0)
    assert hold.raise_above == 10.5
    assert "running shards free what they do not spend as they finish" in plan.message


def test_without_max_per_shard_nothing_is_reserved() -> None:
    shards = [*running(0.5), *pending(5)]
    plan = plan_dispatch(inputs(shards, max_concurrency=6, budget=budget_at(3.0, 10.0, 0.8)))
    assert plan.claimable == ("p0", "p1", "p2", "p3", "p4")
    assert plan.budget_hold is None and plan.reason is LimitReason.NONE


def test_a_retried_shard_reserves_only_what_its_cap_leaves_and_may_go_first() -> None:
    # 1 left: the fresh p0 (needs 2) waits, the retried p1 (spent 1.5 of its 2) fits.
    shards = [shard("p0", P.PENDING), shard("p1", P.PENDING, cost=1.5)]
    plan = plan_dispatch(inputs(shards, budget=budget_at(9.0, 10.0, 0.95, 2.0)))
    assert plan.claimable == ("p1",)
    assert "needs 2" in plan.skipped["p0"]


def test_finalize_keeps_its_rule_and_is_not_reserved_for() -> None:
    shards = [shard("w0", P.DONE, cost=9.0), shard("final", shard_class=FIN)]
    plan = plan_dispatch(inputs(shards, budget=budget_at(9.0, 10.0, 0.8, 2.0)))
    assert plan.claimable == ("final",), "from the warn ratio up to the limit, as before"
    assert plan.budget_hold is None


def test_nothing_fits_and_nothing_runs_holds_with_the_fix() -> None:
    plan = plan_dispatch(
        inputs(pending(3), total_items=50, cut_items=30, budget=budget_at(7.0, 8.0, 0.95, 2.0))
    )
    assert plan.claimable == () and len(plan.start_workers) == 0
    hold = plan.budget_hold
    assert hold is not None and hold.cause is HoldCause.NO_ROOM and not hold.lifts_itself
    assert hold.waiting == 5, "the 3 pending and the 2 not cut yet"
    assert hold.raise_above == 9.0
    assert plan.reason is LimitReason.BUDGET
    assert "raise spec.budget.limit above 9 to go on" in plan.message


def test_at_the_warn_ratio_work_left_is_held_until_the_limit_is_raised() -> None:
    warn = budget_at(85.0, 100.0, 0.8)
    plan = plan_dispatch(
        inputs([*pending(2), shard("d0", P.DONE)], total_items=50, cut_items=30, budget=warn)
    )
    hold = plan.budget_hold
    assert hold is not None and hold.cause is HoldCause.WARN_RATIO
    assert hold.waiting == 4 and hold.raise_above == pytest.approx(106.25)
    assert "from the warn ratio no work shard starts; 4 work shard(s) left wait" in hold.describe(warn, "c")
    assert "kubectl campaign cancel c" in hold.describe(warn, "c")
    raised_limit = budget_at(85.0, 107.0, 0.8)
    shards = [*pending(2), shard("d0", P.DONE)]
    raised = plan_dispatch(inputs(shards, total_items=50, cut_items=30, budget=raised_limit))
    assert raised.claimable == ("p0", "p1") and raised.budget_hold is None


def test_at_the_limit_work_left_is_held_and_paused() -> None:
    plan = plan_dispatch(inputs([*running(1.0), *pending(2)], budget=budget_at(10.0, 10.0, 0.8, 2.0)))
    hold = plan.budget_hold
    assert hold is not None and hold.cause is HoldCause.LIMIT and not hold.lifts_itself
    assert set(plan.pause) == {"p0", "p1"}


def test_no_hold_when_no_work_is_left_or_the_campaign_is_suspended() -> None:
    warn = budget_at(85.0, 100.0, 0.8)
    assert plan_dispatch(inputs([*running(1.0), shard("d0", P.DONE)], budget=warn)).budget_hold is None
    assert plan_dispatch(inputs(pending(2), budget=warn, suspended=True)).budget_hold is None
    assert plan_dispatch(inputs(pending(2), budget=budget_at(1.0, 10.0, 0.8, 2.0))).budget_hold is None


# --- properties -------------------------------------------------------------------------------------


@st.composite
def budgets(draw: st.DrawFn) -> tuple[Decimal, Decimal, float]:
    limit = draw(st.decimals(Decimal(1), Decimal(100), places=2))
    share = draw(st.decimals(Decimal("0.01"), Decimal(1), places=2))
    return limit, share * limit, draw(st.sampled_from([0.5, 0.8, 0.99]))


@settings(max_examples=300, deadline=None)
@given(
    budget=budgets(),
    phases=st.lists(
        st.tuples(
            st.sampled_from([P.PENDING, P.RUNNING, P.DONE, P.QUEUED]),
            st.decimals(0, Decimal("1.2"), places=2),
        ),
        max_size=25,
    ),
    max_concurrency=st.integers(0, 12),
)
def test_claimable_work_fits_the_limit_together(
    budget: tuple[Decimal, Decimal, float], phases: list[tuple[ShardPhase, Decimal]], max_concurrency: int
) -> None:
    limit, cap, warn = budget
    shards = [shard(f"s{i}", phase, cost=share * cap) for i, (phase, share) in enumerate(phases)]
    status = budget_at(sum((s.cost for s in shards), Decimal(0)), limit, warn, cap)
    plan = plan_dispatch(inputs(shards, max_concurrency=max_concurrency, budget=status))
    views = {s.name: s for s in shards}
    held = reserved(cap, (s.cost for s in shards if s.phase is P.RUNNING))
    starting = sum((reservation(cap, views[name].cost) for name in plan.claimable), Decimal(0))
    if plan.claimable:
        assert status.spent + held + starting <= limit
    held_back = [name for name, why in plan.skipped.items() if why.startswith("budget: needs")]
    assert bool(held_back) <= (plan.budget_hold is not None)


@dataclass
class _Shard:
    index: int
    phase: ShardPhase = P.PENDING
    cost: Decimal = Decimal(0)

    def view(self) -> ShardView:
        return shard(f"s{self.index}", self.phase, index=self.index, cost=self.cost)


LOOK = st.tuples(st.just("look"), st.integers(1, 12))
SPEND = st.tuples(st.just("spend"), st.integers(0, 40), st.decimals(0, 1, places=2))
END = st.tuples(st.just("end"), st.integers(0, 40), st.booleans())


@settings(max_examples=300, deadline=None)
@given(
    budget=budgets(),
    shard_count=st.integers(1, 40),
    max_concurrency=st.integers(1, 12),
    steps=st.lists(st.one_of(LOOK, SPEND, END), max_size=120),
    seed=st.integers(0, 2**32),
)
def test_many_workers_claiming_at_once_keep_the_spend_within_the_limit(
    budget: tuple[Decimal, Decimal, float],
    shard_count: int,
    max_concurrency: int,
    steps: list[tuple[object, ...]],
    seed: int,
) -> None:
    """maxConcurrency workers; at a "look" a crowd of idle ones reads the campaign at the same moment
    and each claims one of the first 5 claimable shards in random order, as `worker.claim.choose`
    does (a shard another worker of the crowd claimed first is lost: its write would conflict). A
    running shard reports spend up to its cap (the worker stops it there) and ends Done, or goes back
    to Pending for a retry with its cost kept. After every step what was spent plus what the running
    shards may still spend stays within the limit, so the final spend does too."""
    limit, cap, warn = budget
    rng = random.Random(seed)
    shards = [_Shard(i) for i in range(shard_count)]

    def spent() -> Decimal:
        return sum((s.cost for s in shards), Decimal(0))

    def live(phase: ShardPhase) -> list[_Shard]:
        return [s for s in shards if s.phase is phase]

    for step in steps:
        kind = step[0]
        if kind == "look":
            crowd = min(int(step[1]), max_concurrency - len(live(P.RUNNING)))  # type: ignore[call-overload]
            status = budget_at(spent(), limit, warn, cap)
            plan = plan_dispatch(
                inputs([s.view() for s in shards], max_concurrency=max_concurrency, budget=status)
            )
            for _ in range(max(crowd, 0)):
                candidates = list(plan.claimable[:5])
                rng.shuffle(candidates)
                for name in candidates:
                    chosen = shards[int(name[1:])]
                    if chosen.phase is P.PENDING:
                        chosen.phase = P.RUNNING
                        break
        elif (busy := live(P.RUNNING)) and kind == "spend":
            target = busy[int(step[1]) % len(busy)]  # type: ignore[call-overload]
            target.cost += money(step[2]) * (cap - target.cost)  # type: ignore[arg-type]
        elif busy and kind == "end":
            target = busy[int(step[1]) % len(busy)]  # type: ignore[call-overload]
            target.phase = P.DONE if step[2] else P.PENDING
        committed = spent() + reserved(cap, (s.cost for s in live(P.RUNNING)))
        assert committed <= limit, (committed, limit, [(s.index, s.phase, s.cost) for s in shards])
    assert spent() <= limit


def test_the_status_carries_max_per_shard() -> None:
    status: BudgetStatus = budget_at(1.0, 10.0, 0.8, 2.0)
    assert status.reserves and not budget_at(1.0, None, 0.8, 2.0).reserves
    assert not budget_at(1.0, 10.0, 0.8).reserves
