from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from shardops.api.enums import CampaignPhase, ShardClass, ShardPhase
from shardops.logic.aggregate import MAX_LISTED_NAMES, Aggregate, CampaignFacts, aggregate
from shardops.logic.budget import BudgetGate
from shardops.logic.conditions import (
    Condition,
    ConditionStatus,
    condition_from_dict,
    condition_to_dict,
    merge_conditions,
    status_changed,
)
from shardops.logic.views import ItemProgress, ShardView
from test_logic_support import NOW, shard

P = ShardPhase
FIN = ShardClass.FINALIZE


def agg(
    shards: list[ShardView], *, suspended: bool = False, remaining_items: int = 0, limit: float | None = None
) -> Aggregate:
    return aggregate(shards, NOW, CampaignFacts(suspended, ItemProgress(remaining_items, 0, 10), limit, 0.8))


def condition(result: Aggregate, kind: str) -> Condition:
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
    assert condition(result, "Progressing").status is ConditionStatus.FALSE


def test_terminal_with_failures_is_completed_and_degraded() -> None:
    result = agg([shard("a", P.DONE), shard("b", P.BLOCKED), shard("c", P.FAILED)])
    assert result.phase is CampaignPhase.COMPLETED
    assert (result.failed, result.blocked) == (("c",), ("b",))
    degraded = condition(result, "Degraded")
    assert degraded.status is ConditionStatus.TRUE
    assert degraded.message == "1 failed (c), 1 blocked (b)"


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
    assert condition(paused, "BudgetLimited").reason == "BudgetExhausted"
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


# --- conditions ---------------------------------------------------------------------------------

LATER = NOW + timedelta(minutes=5)


def test_merge_keeps_transition_time_when_status_is_unchanged() -> None:
    first = merge_conditions([], [Condition("Ready", ConditionStatus.FALSE, "Init", "a")], NOW, 1)
    assert first[0].last_transition_time == NOW and first[0].observed_generation == 1
    same = merge_conditions(first, [Condition("Ready", ConditionStatus.FALSE, "Other", "b")], LATER, 2)
    assert same[0].last_transition_time == NOW
    assert (same[0].reason, same[0].message, same[0].observed_generation) == ("Other", "b", 2)
    flipped = merge_conditions(same, [Condition("Ready", ConditionStatus.TRUE, "Up", "c")], LATER, 2)
    assert flipped[0].last_transition_time == LATER


def test_merge_keeps_other_types_in_place() -> None:
    old = merge_conditions(
        [],
        [Condition("A", ConditionStatus.TRUE, "X", ""), Condition("B", ConditionStatus.TRUE, "X", "")],
        NOW,
        1,
    )
    merged = merge_conditions(old, [Condition("C", ConditionStatus.TRUE, "X", "")], LATER, 1)
    assert [c.type for c in merged] == ["A", "B", "C"]
    assert merged[0] == old[0]


def test_condition_dict_round_trip() -> None:
    merged = merge_conditions([], [Condition("Ready", ConditionStatus.TRUE, "Up", "ok")], NOW, 3)[0]
    data = condition_to_dict(merged)
    assert data == {
        "type": "Ready",
        "status": "True",
        "reason": "Up",
        "message": "ok",
        "lastTransitionTime": "2025-01-01T12:00:00Z",
        "observedGeneration": 3,
    }
    assert condition_from_dict(data) == merged


def test_status_changed_compares_only_keys_we_set() -> None:
    old = {"phase": "Running", "counts": {"Done": 1, "Pending": 2}, "other": "theirs"}
    assert not status_changed(old, {"counts": {"Pending": 2, "Done": 1.0}, "phase": "Running"})
    assert status_changed(old, {"phase": "Paused"})
    assert not status_changed(old, {"gone": None})
    assert status_changed(None, {"phase": "Running"})
