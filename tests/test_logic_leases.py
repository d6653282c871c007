from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from logickit import NOW
from shardops.api.enums import StallPolicy
from shardops.logic.leases import (
    LeaseObservation,
    LeaseVerdict,
    classify_lease,
    heartbeat_present,
    lease_action,
    track_progress,
)
from shardops.logic.transitions import Action

HEARTBEAT = 40.0


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def observe(
    *, lease_until: datetime, last_heartbeat: datetime | None, progress_changed_at: datetime
) -> LeaseObservation:
    return LeaseObservation(lease_until, last_heartbeat, HEARTBEAT, progress_changed_at)


def verdict(obs: LeaseObservation, now: datetime = NOW) -> LeaseVerdict:
    return classify_lease(obs, now, stall_heartbeats=2).verdict


def test_heartbeat_with_rising_progress_is_progressing() -> None:
    obs = observe(lease_until=NOW + s(100), last_heartbeat=NOW - s(5), progress_changed_at=NOW - s(5))
    assert verdict(obs) is LeaseVerdict.PROGRESSING


def test_heartbeat_without_progress_for_two_cycles_is_stuck() -> None:
    just_under = observe(lease_until=NOW + s(100), last_heartbeat=NOW - s(1), progress_changed_at=NOW - s(79))
    at_window = observe(lease_until=NOW + s(100), last_heartbeat=NOW - s(1), progress_changed_at=NOW - s(80))
    assert verdict(just_under) is LeaseVerdict.PROGRESSING
    result = classify_lease(at_window, NOW, stall_heartbeats=2)
    assert result.verdict is LeaseVerdict.STUCK
    assert "80s" in result.reason


def test_no_heartbeat_with_valid_lease_is_maybe_a_long_call() -> None:
    never = observe(lease_until=NOW + s(30), last_heartbeat=None, progress_changed_at=NOW - s(500))
    late = observe(lease_until=NOW + s(1), last_heartbeat=NOW - s(81), progress_changed_at=NOW - s(500))
    assert verdict(never) is LeaseVerdict.MAYBE_LONG_CALL
    assert verdict(late) is LeaseVerdict.MAYBE_LONG_CALL
    assert "not stealing" in classify_lease(late, NOW, 2).reason


def test_expired_lease_is_a_zombie_even_with_recent_heartbeat() -> None:
    obs = observe(lease_until=NOW, last_heartbeat=NOW - s(1), progress_changed_at=NOW - s(1))
    result = classify_lease(obs, NOW + s(10), stall_heartbeats=2)
    assert result.verdict is LeaseVerdict.ZOMBIE
    assert "10s ago" in result.reason


def test_one_missed_beat_is_tolerated_two_are_not() -> None:
    assert heartbeat_present(NOW - s(80), HEARTBEAT, NOW)
    assert not heartbeat_present(NOW - s(80.5), HEARTBEAT, NOW)
    assert not heartbeat_present(None, HEARTBEAT, NOW)


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
    obs = LeaseObservation(NOW, None, 0.0, NOW)
    with pytest.raises(ValueError):
        classify_lease(obs, NOW, 2)
