from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardops.api.enums import CampaignPhase, ConditionStatus, ConditionType, ShardClass, ShardPhase
from shardops.logic import conditions
from shardops.logic.aggregate import MAX_LISTED_NAMES, Aggregate, CampaignFacts, aggregate
from shardops.logic.budget import BudgetGate, BudgetHold, HoldCause
from shardops.logic.conditions import DesiredCondition
from shardops.logic.shardview import ItemProgress, ShardView
from tests.logickit import NOW, budget_at, money, shard

P = ShardPhase
FIN = ShardClass.FINALIZE


def agg(
    shards: list[ShardView],
    *,
    suspended: bool = False,
    remaining_items: int = 0,
    limit: float | None = None,
    finalize_pending: bool = False,
    previous_spent: float = 0.0,
    campaign: str = "papers",
) -> Aggregate:
    facts = CampaignFacts(
        suspended,
        ItemProgress(remaining_items, 0, 10),
        None if limit is None else money(limit),
        0.8,
        finalize_pending,
        money(previous_spent),
        campaign,
    )
    return aggregate(shards, NOW, facts)


def condition(result: Aggregate, kind: str) -> DesiredCondition:
    return next(c for c in result.conditions if c.type == kind)


def test_counts_progress_spend_and_oldest_pending() -> None:
    shards = [
        shard("a", P.DONE, cost=1.25),
        shard("b", P.PENDING, since=NOW - timedelta(minutes=3)),
        shard("c", P.PENDING, since=NOW - timedelta(minutes=1)),
        shard("d", P.RUNNING, cost=0.5),
    ]
    result = agg(shards, remaining_items=25)
    assert result.counts[P.DONE] == 1 and result.counts[P.PENDING] == 2 and result.counts[P.BLOCKED] == 0
    assert result.total_shards == 7
    assert result.progress_text == "1/7"
    assert result.oldest_pending_age == timedelta(minutes=3)
    assert result.spent == 1.75
    assert result.phase is CampaignPhase.RUNNING


def test_nothing_started_is_pending() -> None:
    assert agg([shard("a"), shard("b", P.QUEUED)]).phase is CampaignPhase.PENDING
    assert agg([shard("a", attempt=2)]).phase is CampaignPhase.RUNNING


def test_all_done_including_finalize_succeeds() -> None:
    result = agg([shard("a", P.DONE), shard("f", P.DONE, shard_class=FIN)])
    assert result.phase is CampaignPhase.SUCCEEDED
    assert condition(result, "Complete").reason == "Succeeded"
    assert condition(result, "Complete").status is ConditionStatus.TRUE


def test_terminal_with_failures_is_completed_and_degraded() -> None:
    result = agg([shard("a", P.DONE), shard("b", P.BLOCKED), shard("c", P.FAILED)])
    assert result.phase is CampaignPhase.COMPLETED
    assert (result.failed, result.blocked) == (("c",), ("b",))
    degraded = condition(result, "Degraded")
    assert degraded.status is ConditionStatus.TRUE
    assert degraded.message.startswith("1 failed (c), 1 blocked (b); ")
    # The fix is the recorded action, named with the campaign (not an edit of spec.retry by hand).
    assert "kubectl campaign retry papers" in degraded.message
    assert "spec.retry.generation" not in degraded.message


def test_terminal_shards_with_items_left_are_not_finished() -> None:
    assert agg([shard("a", P.DONE)], remaining_items=5).phase is CampaignPhase.RUNNING


def test_finalizing_once_work_is_terminal() -> None:
    result = agg([shard("a", P.DONE), shard("f", P.RUNNING, shard_class=FIN)])
    assert result.phase is CampaignPhase.FINALIZING


def test_budget_exhausted_is_paused_and_suspend_wins() -> None:
    shards = [shard("a", P.DONE, cost=10.0), shard("b", P.PAUSED)]
    paused = agg(shards, limit=10.0)
    assert paused.phase is CampaignPhase.PAUSED
    assert paused.budget.gate is BudgetGate.EXHAUSTED
    assert condition(paused, "BudgetExhausted").status is ConditionStatus.TRUE
    assert condition(paused, "BudgetWarning").status is ConditionStatus.TRUE
    assert agg(shards, limit=10.0, suspended=True).phase is CampaignPhase.SUSPENDED


def test_listed_names_are_bounded() -> None:
    result = agg([shard(f"f{i:03}", P.FAILED) for i in range(50)])
    assert result.failed_count == 50
    assert len(result.failed) == MAX_LISTED_NAMES
    assert "+30 more" in condition(result, "Degraded").message


def test_empty_campaign_succeeds() -> None:
    result = agg([])
    assert result.phase is CampaignPhase.SUCCEEDED and result.progress_text == "0/0"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ShardPhase), st.sampled_from(ShardClass)), max_size=40))
def test_counts_always_sum_to_the_number_of_shards(spec: list[tuple[ShardPhase, ShardClass]]) -> None:
    shards = [shard(f"s{i}", phase, shard_class=cls) for i, (phase, cls) in enumerate(spec)]
    result = agg(shards)
    assert sum(result.counts.values()) == len(shards)
    assert set(result.counts) == set(ShardPhase)


def test_finalize_not_yet_created_keeps_the_campaign_finalizing() -> None:
    result = agg([shard("a", P.DONE), shard("b", P.DONE)], finalize_pending=True)
    assert result.phase is CampaignPhase.FINALIZING
    assert result.total_shards == 3 and result.progress_text == "2/3"
    assert condition(result, "Complete").status is ConditionStatus.FALSE


def test_spend_never_goes_down() -> None:
    assert agg([shard("a", P.DONE, cost=2.0)], previous_spent=5.0).spent == 5.0
    assert agg([shard("a", P.DONE, cost=7.0)], previous_spent=5.0).spent == 7.0


def test_budget_warning_without_exhaustion() -> None:
    result = agg([shard("a", P.DONE, cost=8.5), shard("b")], limit=10.0)
    assert result.phase is CampaignPhase.RUNNING
    assert condition(result, "BudgetWarning").status is ConditionStatus.TRUE
    assert "only finalize shards start" in condition(result, "BudgetWarning").message
    assert condition(result, "BudgetExhausted").status is ConditionStatus.FALSE


# --- condition builders -------------------------------------------------------------------------


def test_every_condition_type_has_a_builder_that_uses_it() -> None:
    built = {
        conditions.ready(None, "ok").type,
        conditions.backpressured(None).type,
        conditions.cluster_full(None).type,
        *(c.type for c in conditions.budget(budget_at(0.0, None, 0.8))),
        conditions.budget_held(None, budget_at(0.0, None, 0.8)).type,
        conditions.degraded([], 0, [], 0).type,
        conditions.suspended(False).type,
        conditions.stalled([]).type,
        conditions.breaker_open([]).type,
        conditions.complete(CampaignPhase.RUNNING, "0/1").type,
        conditions.scheduled("me", True).type,
        conditions.workers_failing(None).type,
        conditions.error_threshold(None).type,
        conditions.waiting_for_quota(None, None).type,
        conditions.source_unresolved([]).type,
    }
    assert built == set(ConditionType)


def test_ready_false_carries_the_problem() -> None:
    bad = conditions.ready("ItemsNotFound", "create ConfigMap items")
    assert (bad.status, bad.reason) == (ConditionStatus.FALSE, "ItemsNotFound")
    assert conditions.ready(None, "fine").status is ConditionStatus.TRUE


def test_limit_conditions_carry_the_planner_numbers() -> None:
    held = conditions.backpressured("pending 20 of bound 20: holding back 3 shard(s)")
    assert held.status is ConditionStatus.TRUE and "20 of bound 20" in held.message
    assert conditions.backpressured(None).status is ConditionStatus.FALSE
    full = conditions.cluster_full("2 worker pod(s) stuck Pending")
    assert full.status is ConditionStatus.TRUE and full.reason == "WorkerPodsPending"


def test_waiting_for_quota_says_which_wait_and_a_missing_queue_comes_first() -> None:
    idle = conditions.waiting_for_quota(None, None)
    assert (idle.status, idle.reason) == (ConditionStatus.FALSE, "NoWorkerQueued")
    waiting = conditions.waiting_for_quota(None, "1 worker Job(s) wait for quota in LocalQueue lq")
    assert (waiting.status, waiting.reason) == (ConditionStatus.TRUE, "QueuedByKueue")
    assert "LocalQueue lq" in waiting.message
    missing = conditions.waiting_for_quota("spec.worker.queueName lq: no LocalQueue lq", "waits")
    assert (missing.status, missing.reason) == (ConditionStatus.TRUE, "LocalQueueNotFound")
    assert missing.message.startswith("spec.worker.queueName lq")


def test_no_budget_means_neither_budget_condition() -> None:
    warn, exhausted = conditions.budget(budget_at(100.0, None, 0.8))
    assert warn.status is ConditionStatus.FALSE and exhausted.status is ConditionStatus.FALSE
    assert warn.reason == "NoBudget"


def test_lists_in_messages_are_bounded() -> None:
    names = [f"s{i:03}" for i in range(30)]
    message = conditions.stalled(names).message
    assert "s019" in message and "s020" not in message and "+10 more" in message
    assert conditions.breaker_open(["A"]).message.startswith("breaker open for (A)")


def test_budget_held_is_false_without_a_limit_or_without_a_hold() -> None:
    unlimited = conditions.budget_held(None, budget_at(5.0, None, 0.8))
    assert (unlimited.status, unlimited.reason) == (ConditionStatus.FALSE, "NoBudget")
    nothing = conditions.budget_held(None, budget_at(5.0, 10.0, 0.8, 2.0), "papers")
    assert (nothing.status, nothing.reason) == (ConditionStatus.FALSE, "NothingHeld")
    assert nothing.message == "spent 5 of 10 (50%), warn at 80%: no work shard waits for the budget"


def _hold(cause: HoldCause, running: int = 0, reserved: float = 0.0) -> BudgetHold:
    return BudgetHold(
        cause,
        waiting=3,
        running=running,
        reserved=money(reserved),
        next_needs=Decimal(2),
        raise_above=Decimal("10.5"),
    )


@pytest.mark.parametrize(
    ("cause", "running", "reason", "says"),
    [
        (HoldCause.WARN_RATIO, 0, "WarnRatioReached", "from the warn ratio no work shard starts; 3 work"),
        (HoldCause.LIMIT, 1, "LimitReached", "the limit is reached; 3 work shard(s) left wait, paused"),
        (
            HoldCause.NO_ROOM,
            0,
            "NoRoomForShard",
            "3 work shard(s) left wait for room (the next needs 2, maxPerShard 2",
        ),
    ],
)
def test_budget_held_names_the_cause_and_the_fix(
    cause: HoldCause, running: int, reason: str, says: str
) -> None:
    status = budget_at(8.5, 10.0, 0.8, 2.0)
    held = conditions.budget_held(_hold(cause, running), status, "papers")
    assert (held.type, held.status, held.reason) == ("BudgetHeld", ConditionStatus.TRUE, reason)
    assert says in held.message
    assert held.message.endswith(
        "raise spec.budget.limit above 10.5 to go on, or accept what is done: "
        "kubectl campaign cancel papers (results stay readable)"
    )


def test_budget_held_by_running_reservations_says_it_lifts_itself() -> None:
    status = budget_at(4.0, 10.0, 0.8, 2.0)
    held = conditions.budget_held(_hold(HoldCause.NO_ROOM, running=3, reserved=5.0), status, "papers")
    assert (held.status, held.reason) == (ConditionStatus.TRUE, "ReservedByRunning")
    assert "5 reserved by 3 running or starting shard(s)" in held.message
    assert "1 of the limit is unreserved" in held.message
    assert held.message.endswith(
        "running shards free what they do not spend as they finish, or raise spec.budget.limit above 10.5"
    )
    assert "cancel" not in held.message
