from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardops.api.enums import ShardClass
from shardops.logic.budget import BudgetGate, accumulate, allows, budget_gate
from tests.logickit import budget_at, money


@pytest.mark.parametrize(
    ("spent", "limit", "gate"),
    [
        (0.0, None, BudgetGate.OPEN),
        (1e9, None, BudgetGate.OPEN),
        (79.99, 100.0, BudgetGate.OPEN),
        (80.0, 100.0, BudgetGate.WARN),
        (99.99, 100.0, BudgetGate.WARN),
        (100.0, 100.0, BudgetGate.EXHAUSTED),
        (150.0, 100.0, BudgetGate.EXHAUSTED),
        (0.0, 0.0, BudgetGate.EXHAUSTED),
    ],
)
def test_gate_thresholds(spent: float, limit: float | None, gate: BudgetGate) -> None:
    assert budget_gate(money(spent), None if limit is None else money(limit), 0.8) is gate


def test_warn_ratio_must_be_a_fraction() -> None:
    with pytest.raises(ValueError):
        budget_gate(Decimal(1), Decimal(10), 1.5)


def test_only_finalize_starts_at_warn_and_nothing_at_exhausted() -> None:
    assert allows(BudgetGate.OPEN, ShardClass.WORK) and allows(BudgetGate.OPEN, ShardClass.FINALIZE)
    assert not allows(BudgetGate.WARN, ShardClass.WORK)
    assert allows(BudgetGate.WARN, ShardClass.FINALIZE)
    assert not allows(BudgetGate.EXHAUSTED, ShardClass.FINALIZE)


def test_describe_has_the_numbers() -> None:
    assert budget_at(85.0, 100.0, 0.8).describe() == "spent 85 of 100 (85%), warn at 80%"
    assert budget_at(3.5, None, 0.8).describe() == "spent 3.5, no budget limit"


def test_accumulate_adds_only_deltas() -> None:
    d = Decimal
    first = accumulate(d(0), {}, {"s1/1": d("1.5"), "s2/1": d(2)})
    assert first.spent == d("3.5")
    again = accumulate(first.spent, first.reported, {"s1/1": d("1.5")})
    assert again.spent == d("3.5")
    later = accumulate(again.spent, again.reported, {"s1/1": d("2.5"), "s2/1": d(1)})
    assert later.spent == d("4.5")
    assert later.reported == {"s1/1": d("2.5"), "s2/1": d(2)}


@settings(max_examples=200, deadline=None)
@given(
    reports=st.lists(
        st.dictionaries(st.sampled_from(["a", "b", "c"]), st.decimals(0, 1000, places=4)), max_size=10
    )
)
def test_rereading_reports_never_double_counts(reports: list[dict[str, Decimal]]) -> None:
    spent, reported = Decimal(0), dict[str, Decimal]()
    for batch in reports:
        for _ in range(2):
            ledger = accumulate(spent, reported, batch)
            spent, reported = ledger.spent, dict(ledger.reported)
    assert spent == sum(reported.values(), Decimal(0))  # exactly: decimals
    for key, value in reported.items():
        assert value == max(batch.get(key, Decimal(0)) for batch in reports)
