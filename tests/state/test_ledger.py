"""Folding Done shards: index ranges, which shards fold, the ledger record, and that the status
counts a folded shard exactly once (as Done, with its cost)."""

from __future__ import annotations

import datetime as dt

from shardops.api.campaign import Campaign
from shardops.api.enums import CampaignPhase, ShardPhase
from shardops.api.folded import FoldedShards
from shardops.api.shard import Shard
from shardops.logic import ranges
from shardops.logic.aggregate import aggregate
from shardops.state import ledger, observe, shardview
from tests.schedulerkit import campaign, shard

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RESULT = {"ref": "p/ns/attempts/k/t1.json", "fingerprint": "sha256:ab", "bytes": 10}


def test_ranges_merge_and_answer_membership() -> None:
    spans = ranges.add([(0, 3)], [3, 4, 7, 9, 8])
    assert spans == [(0, 5), (7, 10)]
    assert [i for i in range(12) if ranges.contains(spans, i)] == [0, 1, 2, 3, 4, 7, 8, 9]
    assert ranges.size(spans) == 8 and ranges.normalize([(5, 5), (2, 4), (1, 2)]) == [(1, 4)]


def _shards() -> list[Shard]:
    return [
        Shard.parse(shard("c", 0, "Done", cost=1.5, result=RESULT)),
        Shard.parse(shard("c", 1, "Running")),
        Shard.parse(shard("c", 2, "Done", cost=2.0, attempt=2, result=RESULT)),
        Shard.parse(shard("c", 3, "Done")),  # Done without a result: never folded
    ]


def test_only_done_shards_with_a_result_fold_and_the_fold_counts_them() -> None:
    shards = _shards()
    chosen = ledger.foldable(shards, FoldedShards())
    assert [s.spec.index for s in chosen] == [0, 2]
    folded = ledger.fold(FoldedShards(), chosen)
    assert (folded.shards, folded.items, folded.cost, folded.attempts, folded.sequence) == (2, 2, 3.5, 3, 1)
    assert folded.ranges() == [(0, 1), (2, 3)]
    assert ledger.foldable(shards, folded) == [], "folding is idempotent"
    assert [s.spec.index for s in ledger.unfolded(shards, folded)] == [1, 3]
    assert ledger.is_folded(shards[0], folded) and not ledger.is_folded(shards[1], folded)


def test_the_record_keeps_what_readers_need_once_the_shard_is_gone() -> None:
    record = ledger.record(_shards()[2])
    assert record["index"] == 2 and record["shard"] == "c-00002"
    assert record["result"] == RESULT and record["attempt"] == 2 and record["cost"] == "2"
    assert record["idempotencyKey"].startswith("sha256:") and record["items"] == 1
    assert isinstance(record["history"], list)


def test_readers_keep_the_first_record_of_each_counted_index() -> None:
    folded = FoldedShards(shards=2, done_ranges=[{"start": 0, "end": 2}])  # type: ignore[list-item]
    lines = [
        {"index": 0, "n": "first"},
        {"index": 5, "n": "lost fold"},
        {"index": 0, "n": "again"},
        {"index": 1},
    ]
    assert ledger.first_records(lines, folded) == {0: {"index": 0, "n": "first"}, 1: {"index": 1}}


def test_a_folded_shard_counts_once_as_done_with_its_cost() -> None:
    body = campaign(items=[{"id": i} for i in range(4)], shardSize=1)
    body["status"] = {"spent": 3.5, "cutShards": 4}
    camp = Campaign.parse(body)
    shards = _shards()
    folded = ledger.fold(FoldedShards(), ledger.foldable(shards, FoldedShards()))
    live = ledger.unfolded(shards, folded)
    facts = observe.campaign_facts(camp, live, 4, folded)
    agg = aggregate([shardview.shard_view(s) for s in live], NOW, facts)
    assert agg.counts[ShardPhase.DONE] == 3  # two folded, one live
    assert agg.total_shards == 4 and agg.spent == 3.5
    assert agg.phase is CampaignPhase.RUNNING
    # Everything folded: the campaign is Succeeded from the status alone.
    done = [Shard.parse(shard("c", i, "Done", result=RESULT)) for i in range(4)]
    every = ledger.fold(FoldedShards(), done)
    all_facts = observe.campaign_facts(camp, [], 4, every)
    assert aggregate([], NOW, all_facts).phase is CampaignPhase.SUCCEEDED


def test_folded_completions_still_break_a_run_of_failures_for_the_error_threshold() -> None:
    from shardops.state import error_threshold
    from tests.schedulerkit import entry

    def failed(index: int, minute: int) -> Shard:
        at = NOW + dt.timedelta(minutes=minute)
        ending = entry("Failed", at, "Failed", errorClass="invalid-input")
        return Shard.parse(shard("c", index, "Failed", history=[ending]))

    done = [
        Shard.parse(
            shard(
                "c",
                10 + i,
                "Done",
                result=RESULT,
                history=[entry("Done", NOW + dt.timedelta(minutes=5 + i), "Completed")],
            )
        )
        for i in range(3)
    ]
    folded = ledger.fold(FoldedShards(), done, keep_completions=2)
    assert folded.recent_completions == [NOW + dt.timedelta(minutes=6), NOW + dt.timedelta(minutes=7)]
    failures = [failed(i, i) for i in range(4)] + [failed(4 + i, 8 + i) for i in range(4)]
    body = campaign(items=[{"id": i} for i in range(20)], shardSize=1)
    tripped = error_threshold.error_threshold_condition(Campaign.parse(body), failures)
    assert tripped.status == "True", "eight non-retryable failures in a row, nothing between them"
    body["status"] = {"folded": folded.to_dict()}
    kept = error_threshold.error_threshold_condition(Campaign.parse(body), failures)
    assert kept.status == "False", "the folded completions at minutes 6 and 7 break the run"


def test_a_fold_counts_errored_items_and_a_shard_of_only_errored_items_as_a_failure() -> None:
    from tests.schedulerkit import entry

    error = {"class": "invalid-input", "message": "items errored", "at": NOW.isoformat()}

    def done(index: int, errored: int) -> Shard:
        ending = entry("Done", NOW + dt.timedelta(minutes=index), "Completed")
        progress = {"done": 2, "total": 2, "errored": errored}
        return Shard.parse(
            shard("c", index, "Done", result=RESULT, history=[ending], progress=progress, lastError=error)
        )

    folded = ledger.fold(FoldedShards(), [done(0, 2), done(1, 1)], keep_completions=5)
    assert folded.errored_items == 3
    assert [(f.shard, f.error_class) for f in folded.recent_failures] == [("c-00000", "invalid-input")]
    assert folded.recent_completions == [NOW + dt.timedelta(minutes=1)]
    live = [done(2, 1), Shard.parse(shard("c", 3, "Running", progress={"done": 1, "total": 2, "errored": 1}))]
    assert ledger.campaign_errored_items(folded, live) == 4, "live Done shards count, unfinished ones not yet"


def test_shards_folded_past_a_status_that_never_recorded_their_cut_are_never_cut_again() -> None:
    """A pass cut shards 2..4 and was killed before its status write (cutShards still 2); the shards
    ran, and the next pass folded and deleted them. The cursor must not go back to 2: the shards
    folded count as cut — both in the status that fold writes and in every pass after it."""
    body = campaign(items=[{"id": i} for i in range(10)], shardSize=1)
    body["status"] = {"cutShards": 2}
    lagging = Campaign.parse(body)
    done = [Shard.parse(shard("camp", i, "Done", result=RESULT)) for i in range(2, 5)]
    folded = ledger.fold(FoldedShards(), done)
    # The fold's own status write: no live shard shows index 4 any more.
    assert observe.campaign_facts(lagging, [], 10, folded).items.cut_items == 5
    # A pass after it, from a status whose folded ranges hold them but whose cutShards lags.
    body["status"] = {"cutShards": 2, "folded": folded.to_dict()}
    after = Campaign.parse(body)
    assert observe.item_progress(after, [], 10).cut_items == 5
    assert observe.item_progress(after, [], 10).uncut_shards == 5


def test_a_rerun_of_errored_items_replaces_its_first_done_record_and_unfold_takes_its_counts_out() -> None:
    folded = FoldedShards(
        shards=2, items=4, errored_items=1, done_ranges=[{"start": 0, "end": 2}], sequence=2
    )  # type: ignore[list-item]
    erred = {"index": 0, "phase": "Done", "items": 2, "errored": 1, "n": "erred"}
    repeat = {"index": 0, "phase": "Done", "items": 2, "errored": 1, "n": "repeat"}
    rerun = {"index": 0, "phase": "Done", "items": 2, "errored": 0, "retryGeneration": 3, "n": "rerun"}
    assert ledger.first_records([erred, repeat], folded)[0]["n"] == "erred", "a repeat of the fold"
    assert ledger.first_records([erred, rerun, repeat], folded)[0]["n"] == "rerun"
    after = ledger.unfold(folded, [erred])
    assert (after.shards, after.items, after.errored_items) == (1, 2, 0)
    assert after.ranges() == [(1, 2)]
    assert ledger.errored_items({"index": 1, "phase": "Failed", "errored": 4}) == 0
