"""The item results of one attempt (worker.tally): pure bookkeeping, no API, no store."""

from __future__ import annotations

from decimal import Decimal

import pytest

from shardops.api.common import TokenCounts
from shardops.api.enums import ErrorClass
from shardops.api.item_errors import errored_result
from shardops.api.shard import Progress
from shardops.logic.idempotency import item_subkey
from shardops.store.records import ItemRecord, encode_result
from shardops.worker.runner import CommandFailure, ResultLine
from shardops.worker.tally import Tally, succeeded_items

A, B, C = {"n": 1}, {"n": 2}, {"n": 3}
KA, KB, KC = (item_subkey(item) for item in (A, B, C))


def test_remaining_skips_items_with_a_result_and_repeats_of_a_key() -> None:
    tally = Tally([A, B, A, C], {KA: ItemRecord("stored")})
    tally.absorb([ResultLine(KC, "fresh", Decimal(0))])
    assert [(w.key, w.index) for w in tally.remaining()] == [(KB, 1)]
    assert tally.progress() == Progress(done=3, total=4)
    assert tally.complete() == Progress(done=4, total=4)


def test_a_done_shard_counts_its_errored_items() -> None:
    tally = Tally([A, B, C], {KA: ItemRecord("stored")})
    refused = errored_result(ErrorClass.INVALID_INPUT, "400")
    tally.absorb([ResultLine(KB, refused, Decimal(0)), ResultLine(KC, "fine", Decimal(0))])
    assert tally.remaining() == []
    assert tally.complete() == Progress(done=3, total=3, errored=1)
    assert Tally([A], {KA: ItemRecord("stored")}).complete().errored is None


def test_the_first_result_of_a_key_counts_and_every_line_is_paid_for() -> None:
    tally = Tally([A, B], {KA: ItemRecord("stored", Decimal("1.0"))}, base_cost=Decimal("2.0"))
    lines = [
        ResultLine(KA, "again", Decimal("0.5")),
        ResultLine(KB, "first", Decimal("0.25")),
        ResultLine(KB, "second", Decimal("0.25")),
    ]
    tally.absorb(lines)
    assert tally.fresh == {KB: ItemRecord("first", Decimal("0.25"))}, (
        "a stored or earlier result was replaced"
    )
    assert tally.attempt_cost == Decimal("1.0") and tally.cost() == Decimal("3.0")


def test_passing_the_per_shard_cap_stops_the_attempt_as_over_budget() -> None:
    tally = Tally([A, B], {}, base_cost=Decimal("0.75"), cap=Decimal("1.0"))
    tally.absorb([ResultLine(KA, "a", Decimal("0.25"))])  # exactly the cap: not over it
    with pytest.raises(CommandFailure) as failure:
        tally.absorb([ResultLine(KB, "b", Decimal("0.125"))])
    assert failure.value.error_class is ErrorClass.OVER_BUDGET
    assert "after 2 of 2 item(s)" in failure.value.message


def test_tokens_are_none_until_an_attempt_reports_some_then_cumulative() -> None:
    assert Tally([A], {}).tokens() is None
    earlier = TokenCounts(input=10, output=2)
    assert Tally([A], {}, base_tokens=earlier).tokens() == earlier
    tally = Tally([A], {})
    tally.absorb([ResultLine(KA, "a", Decimal(0), TokenCounts(input=3, cached_input=1, output=4))])
    assert tally.tokens() == TokenCounts(input=3, cached_input=1, output=4)
    tally.base_tokens = earlier
    assert tally.tokens() == TokenCounts(input=13, cached_input=1, output=6)


def test_stored_results_move_out_of_fresh_and_entries_follow_the_item_order() -> None:
    tally = Tally([B, A], {KA: ItemRecord("a", Decimal("0.5"))})
    tally.absorb([ResultLine(KB, "b", Decimal("0.25"))])
    tally.mark_stored()
    assert tally.fresh == {} and set(tally.stored) == {KA, KB}
    assert tally.entries() == ([(0, KB, "b"), (1, KA, "a")], {KB: Decimal("0.25"), KA: Decimal("0.5")})


def test_a_rerun_of_the_errored_items_runs_just_them_and_keeps_the_others_with_their_costs() -> None:
    """status.rerunErrored: the items that succeeded in the shard's result count as stored (their
    cost kept), the errored ones, stored or in the result, run again."""
    refused = errored_result(ErrorClass.INVALID_INPUT, "400")
    document = encode_result(
        "key", [(0, KA, "a"), (1, KB, refused), (2, KC, "c")], {KA: Decimal("0.5"), KB: Decimal("0.1")}
    )
    tally = Tally([A, B, C], {KB: ItemRecord(refused)})
    tally.rerun_errored(document)
    assert [w.key for w in tally.remaining()] == [KB]
    assert tally.stored[KA] == ItemRecord("a", Decimal("0.5")) and tally.stored[KC].cost == 0
    assert succeeded_items("not a result") == {}
    without = Tally([A, B], {KA: ItemRecord(refused)})
    without.rerun_errored(None)
    assert [w.key for w in without.remaining()] == [KA, KB]
