from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from shardops.api.enums import BreakerState, ErrorClass
from shardops.logic.breaker import (
    CLOSED_BREAKER,
    CLOSED_SHARED,
    BreakerPolicy,
    Route,
    SharedBreaker,
    SourceBreaker,
    adopted,
    effective,
    holds,
    record_failure,
    record_success,
    route,
    shared_state,
)
from tests.logickit import NOW

POLICY = BreakerPolicy(threshold=3, cooldown=timedelta(minutes=5))
LATER = NOW + POLICY.cooldown


def failures(count: int, error_class: ErrorClass = ErrorClass.RATE_LIMITED) -> SourceBreaker:
    breaker = CLOSED_BREAKER
    for _ in range(count):
        breaker = record_failure(breaker, error_class, NOW, POLICY)
    return breaker


def test_opens_at_the_third_consecutive_rate_limit_not_before() -> None:
    assert effective(failures(2), NOW, POLICY.cooldown) is BreakerState.CLOSED
    opened = failures(3)
    assert opened.state is BreakerState.OPEN and opened.opened_at == NOW
    assert effective(opened, NOW, POLICY.cooldown) is BreakerState.OPEN


def test_other_error_classes_neither_count_nor_reset() -> None:
    breaker = failures(2)
    for other in (ErrorClass.TIMEOUT, ErrorClass.UNAVAILABLE, ErrorClass.UNAUTHORIZED):
        breaker = record_failure(breaker, other, NOW, POLICY)
    assert breaker.consecutive_rate_limited == 2
    assert record_failure(breaker, ErrorClass.RATE_LIMITED, NOW, POLICY).state is BreakerState.OPEN


def test_success_resets_the_streak() -> None:
    breaker = record_success(failures(2), NOW, POLICY)
    assert breaker == CLOSED_BREAKER
    assert failures(0) == CLOSED_BREAKER


def test_half_open_after_cooldown() -> None:
    opened = failures(3)
    assert effective(opened, LATER - timedelta(seconds=1), POLICY.cooldown) is BreakerState.OPEN
    assert effective(opened, LATER, POLICY.cooldown) is BreakerState.HALF_OPEN


def test_probe_success_closes_and_failure_reopens() -> None:
    opened = failures(3)
    assert record_success(opened, LATER, POLICY) == CLOSED_BREAKER
    reopened = record_failure(opened, ErrorClass.RATE_LIMITED, LATER, POLICY)
    assert reopened.state is BreakerState.OPEN and reopened.opened_at == LATER
    assert effective(reopened, LATER, POLICY.cooldown) is BreakerState.OPEN


def test_late_success_while_open_does_not_close() -> None:
    opened = failures(3)
    assert record_success(opened, NOW + timedelta(seconds=1), POLICY) == opened


def test_breaker_read_back_as_half_open_behaves_like_open_after_cooldown() -> None:
    stored = SourceBreaker(BreakerState.HALF_OPEN, 3, NOW)
    assert effective(stored, LATER, POLICY.cooldown) is BreakerState.HALF_OPEN
    assert record_failure(stored, ErrorClass.RATE_LIMITED, LATER, POLICY).state is BreakerState.OPEN


def test_route_uses_source_when_closed_and_unknown_sources_are_closed() -> None:
    assert route("a", {}, {}, NOW, POLICY.cooldown, probing=set()) == Route("a", probe=False)


def test_route_falls_back_when_open_and_blocks_when_all_open() -> None:
    breakers = {"a": failures(3)}
    assert route("a", breakers, {"a": "b"}, NOW, POLICY.cooldown, probing=set()) == Route("b", False)
    assert route("a", breakers, {}, NOW, POLICY.cooldown, probing=set()) is None
    both = {"a": failures(3), "b": failures(3)}
    assert route("a", both, {"a": "b", "b": "a"}, NOW, POLICY.cooldown, probing=set()) is None


def test_half_open_allows_one_probe_then_falls_back() -> None:
    breakers = {"a": failures(3)}
    assert route("a", breakers, {"a": "b"}, LATER, POLICY.cooldown, probing=set()) == Route("a", probe=True)
    assert route("a", breakers, {"a": "b"}, LATER, POLICY.cooldown, probing={"a"}) == Route("b", False)
    assert route("a", breakers, {}, LATER, POLICY.cooldown, probing={"a"}) is None


@settings(max_examples=200, deadline=None)
@given(
    threshold=st.integers(min_value=1, max_value=10),
    events=st.lists(st.sampled_from([*ErrorClass, "success"]), max_size=40),
)
def test_opens_exactly_at_threshold_consecutive_rate_limits(threshold: int, events: list[object]) -> None:
    policy = BreakerPolicy(threshold, timedelta(minutes=5))
    breaker = CLOSED_BREAKER
    streak = 0
    for event in events:
        if breaker.state is BreakerState.OPEN:
            break
        if event == "success":
            breaker, streak = record_success(breaker, NOW, policy), 0
            continue
        assert isinstance(event, ErrorClass)
        breaker = record_failure(breaker, event, NOW, policy)
        streak += event is ErrorClass.RATE_LIMITED
        assert (breaker.state is BreakerState.OPEN) == (streak >= threshold)
        assert streak <= threshold


# --- one breaker per shared Source ----------------------------------------------------------------

SHARED_POLICY = BreakerPolicy(threshold=3, cooldown=timedelta(seconds=120))
S0 = datetime(2026, 1, 1, tzinfo=UTC)


def _streak(n: int) -> SourceBreaker:
    return SourceBreaker(BreakerState.CLOSED, n, None)


def test_the_campaigns_streaks_on_a_source_add_up_to_open_it() -> None:
    campaigns = {"a": _streak(1), "b": _streak(1)}
    assert shared_state(CLOSED_SHARED, campaigns, {}, set(), SHARED_POLICY, S0).state is BreakerState.CLOSED
    campaigns["c"] = _streak(1)
    opened = shared_state(CLOSED_SHARED, campaigns, {}, set(), SHARED_POLICY, S0)
    assert (opened.state, opened.opened_at) == (BreakerState.OPEN, S0)


def test_a_campaigns_own_open_breaker_opens_the_source_unless_it_is_older_than_the_last_close() -> None:
    own = SourceBreaker(BreakerState.OPEN, 3, S0 - timedelta(seconds=5))
    closed_later = SharedBreaker(BreakerState.CLOSED, closed_at=S0 - timedelta(seconds=1))
    assert shared_state(closed_later, {"a": own}, {}, set(), SHARED_POLICY, S0).state is BreakerState.CLOSED
    opened = shared_state(CLOSED_SHARED, {"a": own}, {}, set(), SHARED_POLICY, S0)
    assert (opened.state, opened.opened_at) == (BreakerState.OPEN, own.opened_at)


def test_every_campaign_adopts_an_open_source_and_only_the_prober_turns_half_open_after_a_cooldown() -> None:
    source = SharedBreaker(BreakerState.OPEN, opened_at=S0)
    own_cooldown = timedelta(seconds=300)  # a campaign's own source default; the Source's is 120 s
    prober, asked_prober = adopted(CLOSED_BREAKER, source, SHARED_POLICY, own_cooldown, prober=True)
    other, asked_other = adopted(CLOSED_BREAKER, source, SHARED_POLICY, own_cooldown, prober=False)
    half_open_at = S0 + SHARED_POLICY.cooldown
    assert effective(prober, half_open_at - timedelta(seconds=1), own_cooldown) is BreakerState.OPEN
    assert effective(prober, half_open_at, own_cooldown) is BreakerState.HALF_OPEN
    assert effective(other, half_open_at, own_cooldown) is BreakerState.OPEN, "one probe per cooldown"
    assert effective(other, half_open_at + SHARED_POLICY.cooldown, own_cooldown) is BreakerState.HALF_OPEN
    assert holds(prober, asked_prober) and holds(other, asked_other)
    assert not holds(CLOSED_BREAKER, asked_prober)


def test_with_a_longer_own_cooldown_the_failure_that_opened_the_source_is_not_held_as_the_campaigns_own() -> (
    None
):
    """The campaign whose own breaker opened the Source (or whose failed probe re-opened it) still
    turns HalfOpen one Source cooldown later, not after its own longer cooldown (e2e: no probe came)."""
    own_cooldown = timedelta(seconds=300)
    for opened_at in (S0, S0 + timedelta(seconds=130)):  # the opening, then a failed probe's
        own = SourceBreaker(BreakerState.OPEN, 3, opened_at)
        source = shared_state(
            SharedBreaker(BreakerState.OPEN, opened_at=S0),
            {"a": own},
            {"a": S0},
            {"a"},
            SHARED_POLICY,
            opened_at,
        )
        assert source.opened_at == opened_at
        prober, asked = adopted(own, source, SHARED_POLICY, own_cooldown, prober=True)
        half_open_at = opened_at + SHARED_POLICY.cooldown
        assert effective(prober, half_open_at - timedelta(seconds=1), own_cooldown) is BreakerState.OPEN
        assert effective(prober, half_open_at, own_cooldown) is BreakerState.HALF_OPEN
        assert holds(prober, asked)
    newer = SourceBreaker(BreakerState.OPEN, 4, S0 + timedelta(seconds=1))
    assert (
        adopted(
            newer, SharedBreaker(BreakerState.OPEN, opened_at=S0), SHARED_POLICY, own_cooldown, prober=True
        )[0]
        == newer
    ), "a failure after the opening is news the Source follows"


def test_a_probe_that_succeeds_closes_the_source_one_that_fails_restarts_its_cooldown() -> None:
    source = SharedBreaker(BreakerState.OPEN, opened_at=S0)
    asked = {"a": S0, "b": S0 + SHARED_POLICY.cooldown}
    now = S0 + SHARED_POLICY.cooldown + timedelta(seconds=3)
    failed_at = now - timedelta(seconds=1)
    failed = {
        "a": SourceBreaker(BreakerState.OPEN, 4, failed_at),
        "b": SourceBreaker(BreakerState.OPEN, 3, asked["b"]),
    }
    again = shared_state(source, failed, asked, {"a", "b"}, SHARED_POLICY, now)
    assert (again.state, again.opened_at) == (BreakerState.OPEN, failed_at)
    succeeded = {"a": CLOSED_BREAKER, "b": SourceBreaker(BreakerState.OPEN, 3, asked["b"])}
    closed = shared_state(source, succeeded, asked, {"a", "b"}, SHARED_POLICY, now)
    assert (closed.state, closed.closed_at) == (BreakerState.CLOSED, now)
    not_yet_held = shared_state(source, succeeded, asked, {"b"}, SHARED_POLICY, now)
    assert not_yet_held.state is BreakerState.OPEN, (
        "a campaign that never held it proves nothing by being closed"
    )
    # Once closed, a campaign still holding the old open breaker drops it.
    stale = SourceBreaker(BreakerState.OPEN, 3, asked["b"])
    assert adopted(stale, closed, SHARED_POLICY, timedelta(seconds=120), prober=False) == (
        CLOSED_BREAKER,
        None,
    )
