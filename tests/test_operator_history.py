"""Folding shard history into breakers and counters: in time order, each entry once."""

from __future__ import annotations

import datetime as dt

from schedulerkit import T0, entry, shard
from shardops.api.enums import BreakerState, ErrorClass
from shardops.api.shard import Shard
from shardops.logic.breaker import CLOSED_BREAKER, BreakerPolicy, SourceBreaker
from shardops.state import history

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
    everything = history.new_outcomes(shards, {}, None)
    assert [(o.shard, o.reason) for o in everything][:2] == [
        ("c-00000", "Materialized"),
        ("c-00001", "Materialized"),
    ]
    failures = [o.at for o in everything if o.reason == "AttemptFailed"]
    assert failures == sorted(failures) == [at(10), at(20), at(30)]

    after_watermark = history.new_outcomes(shards, {}, at(20))
    assert [o.at for o in after_watermark] == [at(29.5), at(30)]
    # This process's own marker for a shard wins over the campaign watermark.
    with_marker = history.new_outcomes(shards, {"c-00001": at(0)}, at(25))
    assert {o.shard for o in with_marker} == {"c-00000", "c-00001"}


def test_mark_folded_moves_markers_and_watermark_forward_only() -> None:
    folded: dict[str, dt.datetime] = {"c-00000": at(50)}
    outcomes = history.new_outcomes([failed_shard(0, 10), failed_shard(1, 40)], {}, None)
    watermark = history.mark_folded(folded, at(45), outcomes)
    assert folded["c-00000"] == at(50) and folded["c-00001"] == at(40)
    assert watermark == at(45)
    assert history.mark_folded({}, None, []) is None


def test_three_consecutive_rate_limited_failures_open_the_breaker() -> None:
    outcomes = history.new_outcomes([failed_shard(0, 10), failed_shard(1, 11), failed_shard(2, 12)], {}, None)
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
    outcomes = history.new_outcomes(
        [failed_shard(0, 10), done, failed_shard(1, 11), failed_shard(2, 12)], {}, None
    )
    fold = history.fold_breakers({}, outcomes, {}, POLICY)
    assert fold.states["A"].state is BreakerState.CLOSED and fold.states["A"].consecutive_rate_limited == 2


def test_other_classes_and_sources_do_not_count() -> None:
    outcomes = history.new_outcomes(
        [failed_shard(0, 10, cls="timeout"), failed_shard(1, 11, source="B"), failed_shard(2, 12)], {}, None
    )
    fold = history.fold_breakers({}, outcomes, {}, POLICY)
    assert fold.states["A"].consecutive_rate_limited == 1
    assert fold.states["B"].consecutive_rate_limited == 1 and fold.opened == []


def test_a_successful_probe_after_the_cooldown_closes_the_breaker() -> None:
    opened = {"A": SourceBreaker(BreakerState.OPEN, 3, at(0))}
    probe = Shard.parse(shard("c", 0, "Done", history=[entry("Done", at(61), "Completed", source="A")]))
    fold = history.fold_breakers(opened, history.new_outcomes([probe], {}, None), {"A": POLICY}, POLICY)
    assert fold.states["A"] == CLOSED_BREAKER and fold.closed == ["A"]
    early = Shard.parse(shard("c", 0, "Done", history=[entry("Done", at(30), "Completed", source="A")]))
    fold = history.fold_breakers(opened, history.new_outcomes([early], {}, None), {"A": POLICY}, POLICY)
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
    counts = history.tally(history.new_outcomes([failed_shard(0, 10), blocked], {}, None))
    assert (counts.claims, counts.lease_expirations, counts.blocked) == (2, 1, 1)
    assert counts.retries == {str(ErrorClass.RATE_LIMITED): 1}
    assert counts.failed == {"invalid-input": 1}
