"""Money is exact: costs, budgets and prices are decimals from the command's line and the user's
manifest to the status, the CLI and the results document; no binary float on the way."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from pydantic import ValidationError

from shardops.api.campaign import Budget, CampaignStatus
from shardops.api.llm import ModelPrice
from shardops.api.money import money_text, parse_money
from shardops.api.shard import ShardStatus
from shardops.cli.campaign_list import CampaignRow, render_list
from shardops.logic.budget import BudgetGate, budget_status, reservation
from shardops.store.records import ItemRecord, decode_item, encode_result
from shardops.worker.runner import CommandFailure, ResultsReader

TENTH = Decimal("0.1")


def test_thirty_tenths_are_three_and_a_tenth_plus_two_tenths_is_three_tenths() -> None:
    assert sum([parse_money(0.1)] * 30, Decimal(0)) == Decimal(3)
    assert parse_money(0.1) + parse_money(0.2) == Decimal("0.3")
    assert money_text(sum([parse_money("0.1")] * 30, Decimal(0))) == "3"


def test_the_budget_gate_compares_exactly() -> None:
    ten_tenths = sum([TENTH] * 10, Decimal(0))
    # As floats, ten 0.1 are 0.9999999999999999: below a limit of 1, the gate stayed open.
    assert budget_status(ten_tenths, Decimal(1), 0.8).gate is BudgetGate.EXHAUSTED
    # The warn ratio is taken as written: 0.7 of 1 is 0.7, and 0.7 spent is at the warn ratio.
    assert budget_status(Decimal("0.7"), Decimal(1), 0.7).gate is BudgetGate.WARN
    assert reservation(Decimal("0.3"), TENTH * 2) == TENTH


@pytest.mark.parametrize(
    ("written", "amount"),
    [
        (5, Decimal(5)),
        (0.5, Decimal("0.5")),
        ("0.5", Decimal("0.5")),
        (" 2.50 ", Decimal("2.5")),
        # What an older operator stored: a JSON number with float noise reads as its own text.
        (0.48000000000000004, Decimal("0.48000000000000004")),
        (1e-7, Decimal("1E-7")),
    ],
)
def test_an_amount_parses_from_a_number_a_string_or_an_old_stored_float(
    written: object, amount: Decimal
) -> None:
    assert Budget.model_validate({"limit": written}).limit == amount


@pytest.mark.parametrize(
    "written", ["abc", "-1", -0.5, "NaN", "Infinity", True, [1], {"a": 1}, "", "1E+999999", "1E-61", 1e18]
)
def test_a_bad_amount_is_refused_naming_the_field(written: object) -> None:
    with pytest.raises(ValidationError) as refused:
        Budget.model_validate({"limit": 1, "maxPerShard": written})
    assert "maxPerShard" in str(refused.value)


def test_max_per_shard_stays_positive_and_within_the_limit() -> None:
    with pytest.raises(ValidationError, match="greater than 0"):
        Budget.model_validate({"limit": 1, "maxPerShard": 0})
    with pytest.raises(ValidationError, match=r"must not exceed spec\.budget\.limit"):
        Budget.model_validate({"limit": "0.5", "maxPerShard": 0.6})
    assert Budget.model_validate({"limit": "0.3", "maxPerShard": 0.3}).max_per_shard == Decimal("0.3")


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (Decimal("3.00"), "3"),
        (Decimal("3E+1"), "30"),
        (Decimal("1E-7"), "0.0000001"),
        (Decimal("0.480"), "0.48"),
        (Decimal(0), "0"),
        (Decimal("0.000"), "0"),
        (Decimal("-0"), "0"),
    ],
)
def test_an_amount_is_written_canonically(amount: Decimal, text: str) -> None:
    assert money_text(amount) == text


def test_the_status_writes_decimal_strings_and_reads_old_numbers() -> None:
    old = CampaignStatus.model_validate({"spent": 0.30000000000000004, "folded": {"cost": 3}})
    assert old.spent == Decimal("0.30000000000000004")
    written = CampaignStatus(spent=sum([TENTH] * 3, Decimal(0))).to_dict()
    assert written["spent"] == "0.3"
    assert json.loads(json.dumps(written))["folded"]["cost"] == "0"
    assert ShardStatus.model_validate({"cost": "0.25"}).to_merge_patch()["cost"] == "0.25"


def test_llm_prices_are_decimals_and_the_cost_exact() -> None:
    price = ModelPrice.model_validate(
        {"model": "m", "inputPerMillion": 0.15, "cachedInputPerMillion": "0.075", "outputPerMillion": 0.6}
    )
    assert price.cost(1000, 200, 500) == Decimal("0.000435")
    assert price.to_dict()["inputPerMillion"] == "0.15"


def _reader(tmp_path: Path, *lines: str) -> ResultsReader:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return ResultsReader(path, [f"k{n}" for n in range(len(lines))], 10_000)


def test_a_command_cost_is_read_from_the_number_text(tmp_path: Path) -> None:
    lines = _reader(
        tmp_path,
        '{"key":"k0","result":{"x":0.5},"cost":0.1}',
        '{"key":"k1","result":1,"cost":"0.2"}',
        '{"key":"k2","result":1,"cost":0.10000000000000000001}',
        '{"key":"k3","result":1}',
    ).poll()
    assert [line.cost for line in lines] == [
        TENTH,
        Decimal("0.2"),
        Decimal("0.10000000000000000001"),
        Decimal(0),
    ]
    # The result's numbers are still floats (the result is the command's, kept as JSON says).
    assert type(lines[0].result["x"]) is not Decimal and lines[0].result["x"] == 0.5


@pytest.mark.parametrize("cost", ["-0.1", '"-1"', '"ten"', "true", "[1]"])
def test_a_bad_cost_is_bad_output_naming_the_line(tmp_path: Path, cost: str) -> None:
    with pytest.raises(CommandFailure, match=r"results line 1: cost must be"):
        _reader(tmp_path, '{"key":"k0","result":1,"cost":' + cost + "}").poll()


def test_stored_item_costs_round_trip_exactly_and_old_records_still_read() -> None:
    record = ItemRecord({"a": 1.25}, Decimal("0.1"))
    assert '"cost":"0.1"' in record.encode()
    assert decode_item(record.encode()) == record
    old = record.encode().replace('"cost":"0.1"', '"cost":0.1')
    assert decode_item(old) == record
    document = json.loads(encode_result("key", [(0, "k", 1)], {"k": Decimal("0.30")}))
    assert document["items"][0]["cost"] == "0.3"


def test_the_list_prints_money_exactly() -> None:
    row = CampaignRow(
        namespace="ns",
        name="c",
        phase="Succeeded",
        done=30,
        total=30,
        running=0,
        pending=0,
        blocked=0,
        failed=0,
        spent=sum([TENTH] * 30, Decimal(0)),
        budget=Decimal("4.50"),
        suspended=False,
        cancelled=None,
        age_seconds=60.0,
    )
    text = render_list([row], all_namespaces=False)
    assert "3/4.5 (67%)" in text
    assert row.as_dict()["spent"] == "3" and row.as_dict()["budget"] == "4.5"
