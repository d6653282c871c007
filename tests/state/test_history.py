"""Folding shard history into breakers and counters: new by sequence, in time order, each entry once."""

from __future__ import annotations

import datetime as dt

from shardops.api.enums import BreakerState, ErrorClass, ShardPhase
from shardops.api.shard import HistoryEntry, Shard
from shardops.logic.breaker import CLOSED_BREAKER, BreakerPolicy, SourceBreaker
from shardops.state import history
from tests.schedulerkit import T0, entry, shard

POLICY = BreakerPolicy(threshold=3, cooldown=dt.timedelta(seconds=60))


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def failed_shard(index: int, *times: float, cls: str = "rate-limited", source: str = "A") -> Shard:
    entries = [entry("Pending", T0, "Materialized")]
    for t in times:
        entries.append(entry("Running", at(t - 0.5), "Claimed", source=source))
        entries.append(entry("Pending", at(t), "AttemptFailed", source=source, errorClass=cls))
    return Shard.parse(shard("c", index, "Pending", history=entries))


def test_new_outcomes_are_sorted_and_skip_what_was_folded() -> None:
    shards = [failed_shard(0, 10, 30), failed_shard(1, 20)]
    everything = history.new_outcomes(shards, {})
    assert [(o.shard, o.reason) for o in everything][:2] == [
        ("c-00000", "Materialized"),
        ("c-00001", "Materialized"),
    ]
    failures = [o.at for o in everything if o.reason == "AttemptFailed"]
    assert failures == sorted(failures) == [at(10), at(20), at(30)]
    # c-00000: Materialized 1, Claimed 2, AttemptFailed 3, Claimed 4, AttemptFailed 5.
    assert [o.sequence for o in everything if o.shard == "c-00000"] == [1, 2, 3, 4, 5]

    after_mark = history.new_outcomes(shards, {"c-00000": 3, "c-00001": 3})
    assert [(o.shard, o.sequence, o.at) for o in after_mark] == [
        ("c-00000", 4, at(29.5)),
        ("c-00000", 5, at(30)),
    ]
    # A shard the map does not name has had nothing folded, whatever the other shards' marks.
    unnamed = history.new_outcomes(shards, {"c-00000": 5})
    assert {o.shard for o in unnamed} == {"c-00001"} and len(unnamed) == 3


def test_an_entry_is_new_by_its_sequence_whatever_its_time() -> None:
    """A worker whose clock lags writes an entry older than everything folded: it is still new."""
    lagging = failed_shard(0, 100)
    status = lagging.current_status
    late = status.with_history(
        HistoryEntry(
            phase=ShardPhase.PENDING,
            at=at(5),
            reason="AttemptFailed",
            source="A",
            error_class=ErrorClass.RATE_LIMITED,
        )
    )
    shard_ = lagging.model_copy(update={"status": late})
    [outcome] = history.new_outcomes([shard_], {"c-00000": 3})
    assert (outcome.sequence, outcome.at) == (4, at(5))


def test_a_status_from_before_sequences_folds_by_its_watermark_once() -> None:
    """No historyFolded (an earlier release wrote the status): the entries up to historyFoldedUntil
    were folded by that release; the marks then cover every entry, so the time rule is applied once."""
    shards = [failed_shard(0, 10, 30), failed_shard(1, 20)]
    legacy = history.new_outcomes(shards, None, at(20))
    assert [(o.shard, o.sequence) for o in legacy] == [("c-00000", 4), ("c-00000", 5)]
    marks = history.folded_marks(shards, None)
    assert marks == {"c-00000": 5, "c-00001": 3}
    assert history.new_outcomes(shards, marks, at(20)) == [], "the watermark is not read again"
    assert len(history.new_outcomes(shards, None, None)) == 8, "no watermark: nothing was folded"


def test_folded_marks_follow_the_live_shards_and_never_go_back() -> None:
    shards = [failed_shard(0, 10), failed_shard(1, 20)]
    marks = history.folded_marks(shards, {"c-00000": 9, "c-00007": 4})
    assert marks == {"c-00000": 9, "c-00001": 3}, "a shard not passed (folded, gone) leaves the map"
    assert history.folded_marks([Shard.parse(shard("c", 2, None))], {}) == {}, "no history, no entry"


def test_a_recorded_sequence_above_a_new_shards_history_was_an_older_shards_of_that_name() -> None:
    numbered = Shard.parse(
        shard("c", 0, "Pending", history=[entry("Pending", T0, "Materialized", sequence=1)])
    )
    assert history.folded_sequence(numbered, {"c-00000": 7}) == 0, "cut again: nothing of it folded"
    assert history.folded_sequence(numbered, {"c-00000": 1}) == 1
    assert history.folded_sequence(numbered, None) == 0
    # Numbered from what is there (no writer's numbers): the recorded sequence stands, never twice.
    legacy = failed_shard(0, 10)
    assert history.folded_sequence(legacy, {"c-00000": 7}) == 7
    assert history.new_outcomes([legacy], {"c-00000": 7}) == []


def test_the_watermark_still_written_is_the_newest_entry_time_folded() -> None:
    outcomes = history.new_outcomes([failed_shard(0, 10), failed_shard(1, 40)], {})
    assert history.watermark_after(at(45), outcomes) == at(45)
    assert history.watermark_after(at(5), outcomes) == at(40)
    assert history.watermark_after(None, []) is None


def test_three_consecutive_rate_limited_failures_open_the_breaker() -> None:
    outcomes = history.new_outcomes([failed_shard(0, 10), failed_shard(1, 11), failed_shard(2, 12)], {})
    fold = history.fold_breakers({}, outcomes, {"A": POLICY}, POLICY)
    assert fold.states["A"] == SourceBreaker(BreakerState.OPEN, 3, at(12))
    assert fold.opened == ["A"] and "3 consecutive rate-limited" in fold.reasons["A"]


def test_a_success_in_between_resets_the_streak() -> None:
    done = Shard.parse(
        shard(
            "c",
            9,
            "Done",
            history=[
                entry("Running", at(10.5), "Claimed", source="A"),
                entry("Done", at(10.6), "Completed", source="A"),
            ],
        )
    )
    outcomes = history.new_outcomes([failed_shard(0, 10), done, failed_shard(1, 11), failed_shard(2, 12)], {})
    fold = history.fold_breakers({}, outcomes, {}, POLICY)
    assert fold.states["A"].state is BreakerState.CLOSED and fold.states["A"].consecutive_rate_limited == 2


def test_other_classes_and_sources_do_not_count() -> None:
    outcomes = history.new_outcomes(
        [failed_shard(0, 10, cls="timeout"), failed_shard(1, 11, source="B"), failed_shard(2, 12)], {}
    )
    fold = history.fold_breakers({}, outcomes, {}, POLICY)
    assert fold.states["A"].consecutive_rate_limited == 1
    assert fold.states["B"].consecutive_rate_limited == 1 and fold.opened == []


def test_a_successful_probe_after_the_cooldown_closes_the_breaker() -> None:
    opened = {"A": SourceBreaker(BreakerState.OPEN, 3, at(0))}
    probe = Shard.parse(shard("c", 0, "Done", history=[entry("Done", at(61), "Completed", source="A")]))
    fold = history.fold_breakers(opened, history.new_outcomes([probe], {}), {"A": POLICY}, POLICY)
    assert fold.states["A"] == CLOSED_BREAKER and fold.closed == ["A"]
    early = Shard.parse(shard("c", 0, "Done", history=[entry("Done", at(30), "Completed", source="A")]))
    fold = history.fold_breakers(opened, history.new_outcomes([early], {}), {"A": POLICY}, POLICY)
    assert fold.states["A"].state is BreakerState.OPEN, "a late success from before the opening says nothing"


def test_tally_counts_each_kind() -> None:
    blocked = Shard.parse(
        shard(
            "c",
            5,
            "Blocked",
            history=[
                entry("Running", at(1), "Claimed"),
                entry("Pending", at(2), "LeaseExpired", errorClass="unknown"),
                entry("Blocked", at(3), "Blocked", errorClass="timeout"),
                entry("Failed", at(4), "Failed", errorClass="invalid-input"),
            ],
        )
    )
    counts = history.tally(history.new_outcomes([failed_shard(0, 10), blocked], {}))
    assert (counts.claims, counts.lease_expirations, counts.blocked) == (2, 1, 1)
    assert counts.retries == {str(ErrorClass.RATE_LIMITED): 1}
    assert counts.failed == {"invalid-input": 1}
