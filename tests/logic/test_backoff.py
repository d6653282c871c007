from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardops.logic.backoff import backoff_bounds, backoff_ceiling, backoff_delay, retry_not_before
from tests.logickit import NOW


@pytest.mark.parametrize(
    ("attempt", "expected"), [(1, 2.0), (2, 4.0), (3, 8.0), (6, 64.0), (7, 120.0), (50, 120.0)]
)
def test_ceiling_doubles_then_caps_with_seed_defaults(attempt: int, expected: float) -> None:
    assert backoff_ceiling(attempt, 2.0, 120.0) == expected


def test_jitter_spans_half_to_full_ceiling() -> None:
    assert backoff_delay(3, 2.0, 120.0, 0.0) == 4.0
    assert backoff_delay(3, 2.0, 120.0, 0.5) == 6.0
    assert backoff_delay(3, 2.0, 120.0, 0.999999) == pytest.approx(8.0, rel=1e-5)


def test_huge_attempt_saturates_at_cap_instead_of_overflowing() -> None:
    assert backoff_ceiling(10**9, 2.0, 120.0) == 120.0


@pytest.mark.parametrize("rand", [-0.1, 1.0, 2.0])
def test_rand_outside_unit_interval_is_refused(rand: float) -> None:
    with pytest.raises(ValueError, match="rand"):
        backoff_delay(1, 2.0, 120.0, rand)


@pytest.mark.parametrize(
    ("attempt", "base", "cap"), [(0, 2.0, 120.0), (1, 0.0, 120.0), (1, 2.0, float("inf"))]
)
def test_nonsense_parameters_are_refused(attempt: int, base: float, cap: float) -> None:
    with pytest.raises(ValueError):
        backoff_ceiling(attempt, base, cap)


def test_not_before_is_now_plus_delay() -> None:
    assert retry_not_before(NOW, 2, 2.0, 120.0, 0.0) == NOW + timedelta(seconds=2)


@settings(max_examples=300, deadline=None)
@given(
    attempt=st.integers(min_value=1, max_value=2000),
    base=st.floats(min_value=0.001, max_value=1e4),
    cap=st.floats(min_value=0.001, max_value=1e6),
    rand=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_delay_always_within_bounds(attempt: int, base: float, cap: float, rand: float) -> None:
    ceiling = min(base * 2.0 ** min(attempt - 1, 1000), cap)
    low, high = backoff_bounds(attempt, base, cap)
    assert (low, high) == (0.5 * ceiling, ceiling)
    assert low <= backoff_delay(attempt, base, cap, rand) <= high
