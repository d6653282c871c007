"""The count-and-budget summary of a campaign's live shards (`Summary`): shard views, phase counts,
the budget, the conditions `logic.aggregate` derives. Pure: no I/O, `now` is a parameter.

One home: the scheduler's status step (`scheduler.status`) and the CLI's status and report views
compute it here, from the same facts, so `kubectl campaign status` counts as the operator does."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shardops.api.campaign import Campaign
from shardops.api.enums import ShardClass, ShardPhase
from shardops.api.folded import FoldedShards
from shardops.api.shard import Shard
from shardops.logic.aggregate import Aggregate, CampaignFacts, aggregate
from shardops.logic.shardview import ShardView
from shardops.state import observe, shardview


@dataclass(frozen=True)
class Summary:
    views: list[ShardView]
    aggregate: Aggregate
    facts: CampaignFacts

    @property
    def counts(self) -> dict[ShardPhase, int]:
        return dict(self.aggregate.counts)

    @property
    def not_cut(self) -> int:
        """Work shards not cut yet (counted as queued by the views)."""
        return self.facts.uncut_shards


def summarize(
    campaign: Campaign,
    shards: Iterable[Shard],
    items_total: int,
    now: dt.datetime,
    folded: FoldedShards | None = None,
) -> Summary:
    """The summary of `shards` (the live, unfolded ones) of a campaign of `items_total` items;
    `folded`: the shards folded into the ledger (default: as the status records them; the scheduler
    passes the fold it is about to write)."""
    shards = list(shards)
    views = [shardview.shard_view(s) for s in shards]
    facts = observe.campaign_facts(campaign, shards, items_total, folded)
    return Summary(views, aggregate(views, now, facts), facts)


def summarize_listed(campaign: Campaign, shards: Sequence[Shard], now: dt.datetime) -> Summary:
    """The summary from what a reader without the items has: the item count as far as it is known
    (`items_total_or_cut`), the status's fold."""
    return summarize(campaign, shards, items_total_or_cut(campaign, shards), now)


def recorded_items_total(campaign: Campaign) -> int | None:
    """Inline items are counted from the spec; itemsFrom from the status once the operator read them."""
    inline = campaign.spec.inline_items_total
    if inline is not None:
        return inline
    return campaign.current_status.items_total


def items_total_or_cut(campaign: Campaign, shards: Sequence[Shard]) -> int:
    """The item count, or (unknown yet) the items already cut into shards, so nothing counts as left."""
    known = recorded_items_total(campaign)
    if known is not None:
        return known
    indices = [s.spec.index for s in shards if s.spec.shard_class is ShardClass.WORK]
    return (max(indices) + 1) * campaign.spec.shard_size if indices else 0
