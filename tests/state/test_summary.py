"""The count-and-budget summary (state/summary.py) the operator's status and the CLI's views share:
the CLI's status counts what the operator's status records, from the same shards."""

from __future__ import annotations

import datetime as dt

from shardops.api.campaign import Campaign
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.cli.campaign_status import status_view
from shardops.state.summary import items_total_or_cut, recorded_items_total, summarize, summarize_listed
from tests.schedulerkit import T0, campaign, shard

NOW = T0 + dt.timedelta(minutes=1)


def _shards() -> list[Shard]:
    result = {"ref": "attempts/x/t1.json", "fingerprint": "sha256:" + "0" * 64, "bytes": 10}
    return [
        Shard.parse(shard("camp", 0, "Done", result=result, cost=2.0)),
        Shard.parse(shard("camp", 1, "Pending")),
    ]


def test_counts_the_phases_the_items_not_cut_and_the_spend() -> None:
    parsed = Campaign.parse(campaign(items=[{"id": i} for i in range(5)], budget={"limit": 10}))
    summary = summarize(parsed, _shards(), 5, NOW)
    assert summary.counts[ShardPhase.DONE] == 1 and summary.counts[ShardPhase.PENDING] == 1
    assert summary.not_cut == 3, "five items, one a shard, two cut"
    assert summary.aggregate.budget.spent == 2.0 and summary.aggregate.budget.limit == 10


def test_without_a_known_item_count_the_cut_items_count_as_all() -> None:
    body = campaign()
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    parsed = Campaign.parse(body)
    assert recorded_items_total(parsed) is None
    assert items_total_or_cut(parsed, _shards()) == 2
    assert summarize_listed(parsed, _shards(), NOW).not_cut == 0, "nothing counts as left"
    recorded = Campaign.parse({**body, "status": {"itemsTotal": 7}})
    assert items_total_or_cut(recorded, _shards()) == 7


def test_the_cli_status_counts_with_the_same_summary() -> None:
    parsed = Campaign.parse(campaign(items=[{"id": i} for i in range(5)]))
    view = status_view(parsed, _shards(), NOW)
    assert view.counts == summarize_listed(parsed, _shards(), NOW).counts
