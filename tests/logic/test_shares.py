"""Shares of a shared Source: fair by weight, priority first when scarce, idle campaigns give theirs
away, and a hand-over that never lets the shares in force pass the limit."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from shardops.logic.shares import (
    MIN_REQUESTS_PER_WORKER,
    SETTLE_MARGIN,
    Claimant,
    Granted,
    Rates,
    fair_shares,
    hand_over,
    settle_time,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SETTLE = dt.timedelta(seconds=45)
LIMITS = Rates(requests_per_minute=120.0, tokens_per_minute=None)


def claimant(
    name: str, weight: int = 1, priority: int = 0, workers: int = 2, active: bool = True
) -> Claimant:
    return Claimant(name, weight, priority, workers, active)


def requests(shares: dict[str, Rates] | dict[str, Granted]) -> dict[str, float | None]:
    return {
        name: (value.rates if isinstance(value, Granted) else value).requests_per_minute
        for name, value in shares.items()
    }


def test_active_campaigns_share_in_proportion_to_their_weights() -> None:
    shares = fair_shares(LIMITS, [claimant("a", 1), claimant("b", 2), claimant("c", 3)])
    assert requests(shares) == {"a": 20.0, "b": 40.0, "c": 60.0}
    assert all(s.tokens_per_minute is None for s in shares.values()), "no token limit, no token share"


def test_prompt_and_completion_token_limits_are_shared_by_weight_like_the_others() -> None:
    limits = Rates(None, None, input_tokens_per_minute=30_000.0, output_tokens_per_minute=9_000.0)
    shares = fair_shares(limits, [claimant("a", 1), claimant("b", 2)])
    assert shares == {"a": Rates(None, None, 10_000.0, 3_000.0), "b": Rates(None, None, 20_000.0, 6_000.0)}
    # A third campaign gets its share of each only once the others' lowering of each is in force.
    granted = {name: Granted(rates) for name, rates in shares.items()}
    targets = fair_shares(limits, [claimant("a", 1), claimant("b", 2), claimant("c", 3)])
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    settle = dt.timedelta(seconds=15)
    first = hand_over(limits, targets, granted, now, settle)
    assert first["c"].rates == Rates(None, None, 0.0, 0.0)
    assert first["b"].rates == Rates(None, None, 10_000.0, 3_000.0) and first["b"].lowered_at == now
    later = hand_over(limits, targets, first, now + settle, settle)
    assert later["c"].rates == Rates(None, None, 15_000.0, 4_500.0)


def test_an_idle_campaigns_share_goes_to_the_others() -> None:
    shares = fair_shares(LIMITS, [claimant("a"), claimant("b", active=False), claimant("c")])
    assert requests(shares) == {"a": 60.0, "b": 0.0, "c": 60.0}


def test_a_scarce_source_serves_higher_priority_first() -> None:
    # 120 requests/minute fit the floors of two campaigns of 50 workers, not three.
    workers = int(50 / MIN_REQUESTS_PER_WORKER)
    shares = fair_shares(
        LIMITS,
        [
            claimant("low", priority=0, workers=workers),
            claimant("high", priority=5, workers=workers),
            claimant("mid", priority=1, workers=workers),
        ],
    )
    assert list(shares) == ["high", "mid", "low"], "serving order"
    assert requests(shares) == {"high": 60.0, "mid": 60.0, "low": 0.0}


def test_the_first_campaign_is_admitted_even_when_its_floor_does_not_fit() -> None:
    shares = fair_shares(LIMITS, [claimant("big", workers=500)])
    assert requests(shares) == {"big": 120.0}


def test_the_first_campaign_gets_the_whole_limit_at_once() -> None:
    granted = hand_over(LIMITS, fair_shares(LIMITS, [claimant("a")]), {}, T0, SETTLE)
    assert requests(granted) == {"a": 120.0}


def test_a_new_campaign_waits_until_the_lowered_share_is_in_force() -> None:
    first = hand_over(LIMITS, fair_shares(LIMITS, [claimant("a")]), {}, T0, SETTLE)
    both = fair_shares(LIMITS, [claimant("a"), claimant("b")])
    step = hand_over(LIMITS, both, first, T0 + dt.timedelta(seconds=20), SETTLE)
    assert requests(step) == {"a": 60.0, "b": 0.0}, "a lowered at once, b not raised yet"
    assert step["a"].lowered_at == T0 + dt.timedelta(seconds=20)
    early = hand_over(LIMITS, both, step, T0 + dt.timedelta(seconds=20) + SETTLE / 2, SETTLE)
    assert requests(early) == {"a": 60.0, "b": 0.0}
    late = hand_over(LIMITS, both, early, T0 + dt.timedelta(seconds=20) + SETTLE, SETTLE)
    assert requests(late) == {"a": 60.0, "b": 60.0}


def test_a_lowering_recorded_only_on_the_source_holds_raises_back() -> None:
    """A campaign whose share was taken away and then forgotten (gone) leaves its lowering in the
    Source's status: raises wait for it too, after a restart as before."""
    granted = {"a": Granted(Rates(60.0))}
    targets = fair_shares(LIMITS, [claimant("a")])
    held = hand_over(LIMITS, targets, granted, T0, SETTLE, source_lowered_at=T0 - SETTLE / 2)
    assert requests(held) == {"a": 60.0}
    freed = hand_over(LIMITS, targets, granted, T0, SETTLE, source_lowered_at=T0 - SETTLE)
    assert requests(freed) == {"a": 120.0}


def test_a_finished_campaign_is_lowered_to_zero_then_forgotten() -> None:
    granted = {"a": Granted(Rates(60.0)), "b": Granted(Rates(60.0))}
    targets = fair_shares(LIMITS, [claimant("a")])
    step = hand_over(LIMITS, targets, granted, T0, SETTLE)
    assert requests(step) == {"a": 60.0, "b": 0.0}
    after = hand_over(LIMITS, targets, step, T0 + SETTLE, SETTLE)
    assert requests(after) == {"a": 120.0}, "b forgotten once settled, its room given to a"


def test_raises_are_given_in_serving_order_within_the_room_left() -> None:
    granted = {"a": Granted(Rates(100.0))}
    targets = fair_shares(LIMITS, [claimant("a", priority=0), claimant("b", priority=1)])
    step = hand_over(LIMITS, targets, granted, T0, SETTLE)
    # b (higher priority) takes the 20 of room at once; a is lowered to its 60.
    assert requests(step) == {"b": 20.0, "a": 60.0}
    assert requests(hand_over(LIMITS, targets, step, T0 + SETTLE, SETTLE)) == {"b": 60.0, "a": 60.0}


def test_settle_time_is_the_longest_heartbeat_and_the_margin() -> None:
    assert settle_time([10.0, 40.0]) == dt.timedelta(seconds=40) + SETTLE_MARGIN


@pytest.mark.parametrize("seed", range(20))
def test_the_shares_in_force_never_pass_the_limit(seed: int) -> None:
    """Campaigns start, stop, go idle and come back at random; the operator passes every second and
    restarts at random (it keeps nothing but what is written). A worker obeys a lowered share only
    `settle` later (the worst case) and a raised one at once: the sum in force stays within the limit."""
    rng = random.Random(seed)
    limits = Rates(requests_per_minute=120.0, tokens_per_minute=10000.0)
    names = [f"c{i}" for i in range(5)]
    weights = {name: rng.randint(1, 4) for name in names}
    state = {name: rng.choice(["off", "active", "idle"]) for name in names}
    granted: dict[str, Granted] = {}
    history: list[dict[str, Rates]] = []
    lag = int(SETTLE.total_seconds())
    for second in range(600):
        if rng.random() < 0.05:
            name = rng.choice(names)
            state[name] = rng.choice(["off", "active", "idle"])
        claimants = [
            claimant(n, weights[n], rng.choice([0, 0, 1]), active=state[n] == "active")
            for n in names
            if state[n] != "off"
        ]
        now = T0 + dt.timedelta(seconds=second)
        granted = hand_over(limits, fair_shares(limits, claimants), granted, now, SETTLE)
        history.append({name: g.rates for name, g in granted.items()})
        recent = history[-lag:]
        for index in range(2):
            in_force = sum(
                max((_dim(rates.get(name), index) for rates in recent), default=0.0) for name in names
            )
            assert in_force <= limits.dimensions()[index] + 1e-9, (second, index, in_force)


def _dim(rates: Rates | None, index: int) -> float:
    if rates is None:
        return 0.0
    value = rates.dimensions()[index]
    return 0.0 if value is None else value
