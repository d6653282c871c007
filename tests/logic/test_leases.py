from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from shardops.api.enums import StallPolicy
from shardops.logic.leases import (
    NOBODY_RENEWS,
    LeaseObservation,
    LeaseVerdict,
    Renewals,
    classify_lease,
    heartbeat_present,
    lease_action,
    track_progress,
)
from shardops.logic.transitions import Action
from tests.logickit import NOW

HEARTBEAT = 40.0
LEASE = 120.0


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def observe(
    *, silent: float, last_heartbeat: datetime | None, progress_changed_at: datetime
) -> LeaseObservation:
    # The holder's leaseUntil is quoted in messages only: a date far off shows that it decides nothing.
    return LeaseObservation(NOW - s(3600), silent, LEASE, last_heartbeat, HEARTBEAT, progress_changed_at)


def verdict(obs: LeaseObservation, now: datetime = NOW) -> LeaseVerdict:
    return classify_lease(obs, now, stall_heartbeats=2).verdict


def test_heartbeat_with_rising_progress_is_progressing() -> None:
    obs = observe(silent=5, last_heartbeat=NOW - s(5), progress_changed_at=NOW - s(5))
    assert verdict(obs) is LeaseVerdict.PROGRESSING


def test_heartbeat_without_progress_for_two_cycles_is_stuck() -> None:
    just_under = observe(silent=1, last_heartbeat=NOW - s(1), progress_changed_at=NOW - s(79))
    at_window = observe(silent=1, last_heartbeat=NOW - s(1), progress_changed_at=NOW - s(80))
    assert verdict(just_under) is LeaseVerdict.PROGRESSING
    result = classify_lease(at_window, NOW, stall_heartbeats=2)
    assert result.verdict is LeaseVerdict.STUCK
    assert "80s" in result.reason


def test_no_heartbeat_with_valid_lease_is_maybe_a_long_call() -> None:
    never = observe(silent=90, last_heartbeat=None, progress_changed_at=NOW - s(500))
    late = observe(silent=119, last_heartbeat=NOW - s(1), progress_changed_at=NOW - s(500))
    assert verdict(never) is LeaseVerdict.MAYBE_LONG_CALL
    assert verdict(late) is LeaseVerdict.MAYBE_LONG_CALL
    assert "not stealing" in classify_lease(late, NOW, 2).reason


def test_a_claim_not_seen_renewed_for_a_lease_duration_is_a_zombie_whatever_its_timestamps_say() -> None:
    # The holder's own heartbeat time looks fresh (its clock runs ahead): the observer's silence decides.
    obs = observe(silent=LEASE, last_heartbeat=NOW + s(30), progress_changed_at=NOW - s(1))
    result = classify_lease(obs, NOW, stall_heartbeats=2)
    assert result.verdict is LeaseVerdict.ZOMBIE
    assert "no renewal seen for 120s" in result.reason
    assert verdict(observe(silent=LEASE - 0.5, last_heartbeat=NOW, progress_changed_at=NOW)) is not (
        LeaseVerdict.ZOMBIE
    )


def test_a_holder_whose_clock_runs_behind_is_alive_while_it_renews() -> None:
    # Its heartbeat and leaseUntil are 30 s in the past by the observer's clock; it renewed 1 s ago.
    obs = observe(silent=1, last_heartbeat=NOW - s(150), progress_changed_at=NOW - s(1))
    assert verdict(obs) is LeaseVerdict.PROGRESSING


def test_a_lease_nobody_holds_is_a_zombie_at_once() -> None:
    obs = observe(silent=NOBODY_RENEWS, last_heartbeat=NOW, progress_changed_at=NOW)
    result = classify_lease(obs, NOW, stall_heartbeats=2)
    assert result.verdict is LeaseVerdict.ZOMBIE
    assert "nobody holds its Lease" in result.reason


def test_one_missed_beat_is_tolerated_two_are_not() -> None:
    assert heartbeat_present(NOW, HEARTBEAT, 80)
    assert not heartbeat_present(NOW, HEARTBEAT, 80.5)
    assert not heartbeat_present(None, HEARTBEAT, 0)


class SteppedClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_renewals_time_a_claim_from_when_its_mark_last_rose_on_the_observers_clock() -> None:
    clock = SteppedClock()
    seen = Renewals(clock)
    assert seen.observe("s", "w1", NOW) == 0.0  # first sight
    clock.now += 7
    assert seen.observe("s", "w1", NOW) == 7.0  # not renewed
    assert seen.observe("s", "w1", NOW + s(0.4)) == 7.0  # the same instant written twice
    assert seen.observe("s", "w1", NOW - s(30)) == 7.0  # an older write read late
    clock.now += 3
    assert seen.observe("s", "w1", NOW + s(10)) == 0.0  # renewed: seen now
    clock.now += 2
    assert seen.observe("s", "w1", NOW + s(10)) == 2.0


def test_renewals_time_each_holder_of_a_key_on_its_own() -> None:
    clock = SteppedClock()
    seen = Renewals(clock)
    seen.observe("s", "old", NOW)
    clock.now += 5
    assert seen.observe("s", "new", NOW + s(99)) == 0.0  # a takeover: the new holder is first seen now
    clock.now += 5
    # The shard still names the old owner, the Lease the new one: neither resets the other.
    assert seen.observe("s", "old", NOW) == 10.0
    assert seen.observe("s", "new", NOW + s(99)) == 5.0


def test_renewals_keep_only_what_the_caller_still_holds() -> None:
    clock = SteppedClock()
    seen = Renewals(clock)
    for key in ("a", "b", "c"):
        seen.observe(key, "w", NOW)
    seen.observe("a", "w2", NOW)
    seen.keep_only({"a"})
    assert len(seen) == 2
    clock.now += 4
    assert seen.observe("b", "w", NOW) == 0.0  # forgotten: first sight again


def test_progress_marker_moves_only_when_done_rises() -> None:
    claimed = NOW - s(100)
    assert track_progress(30, claimed, 30, NOW) == claimed
    assert track_progress(30, claimed, 29, NOW) == claimed
    assert track_progress(30, claimed, 31, NOW) == NOW


@pytest.mark.parametrize(
    ("verdict_", "policy", "attempt", "action"),
    [
        (LeaseVerdict.ZOMBIE, StallPolicy.REPORT, 1, Action.RECLAIM),
        (LeaseVerdict.ZOMBIE, StallPolicy.REPORT, 3, Action.BLOCK),
        (LeaseVerdict.STUCK, StallPolicy.REPORT, 1, None),
        (LeaseVerdict.STUCK, StallPolicy.REVOKE, 1, Action.REVOKE),
        (LeaseVerdict.STUCK, StallPolicy.REVOKE, 3, Action.BLOCK),
        (LeaseVerdict.MAYBE_LONG_CALL, StallPolicy.REVOKE, 1, None),
        (LeaseVerdict.PROGRESSING, StallPolicy.REVOKE, 1, None),
    ],
)
def test_lease_actions(
    verdict_: LeaseVerdict, policy: StallPolicy, attempt: int, action: Action | None
) -> None:
    assert lease_action(verdict_, policy, attempt, 3) is action


def test_bad_parameters_are_refused() -> None:
    obs = LeaseObservation(NOW, 0.0, LEASE, None, 0.0, NOW)
    with pytest.raises(ValueError):
        classify_lease(obs, NOW, 2)
