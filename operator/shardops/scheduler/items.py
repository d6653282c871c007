"""A campaign's items as a pass sees them (`Items`): inline, a ConfigMap's, or an S3 object's
streamed slice by slice; checked once per spec generation.

A bad input raises `campaigns.ItemsUnavailable` naming the fix (the pass then sets Ready=False and
cuts nothing)."""

from __future__ import annotations

from collections.abc import Sequence

from shardops.api.campaign import Campaign
from shardops.api.common import Item
from shardops.api.enums import ConditionReason
from shardops.api.items import ItemsObject
from shardops.api.store import resolve_result_store
from shardops.k8s import campaigns
from shardops.k8s.api import KubeClient
from shardops.logic.shard_items import ShardItemsTooLarge, check_shard_items
from shardops.scheduler.memory import Memory
from shardops.store.installation import Stores
from shardops.store.items import (
    StreamedItems,
    check_batch_lines_of,
    check_inline,
    configmap_items,
    object_items,
)
from shardops.store.lines import NotJsonlText
from shardops.store.records import StoreUnavailable


class Items:
    def __init__(self, kube: KubeClient, stores: Stores) -> None:
        self.kube = kube
        self.stores = stores

    def read(self, campaign: Campaign, memory: Memory) -> Sequence[Item]:
        """The campaign's items, read (and checked) once per spec generation: items are the
        campaign's input and are not expected to change under a running campaign; a fixed spec (new
        generation) reads them again."""
        source = campaign.spec.items_from
        if campaign.spec.items is None and source is None:  # pragma: no cover - the model requires one
            raise campaigns.ItemsUnavailable(ConditionReason.NO_ITEMS, "set spec.items or spec.itemsFrom")
        cache_key = (
            campaign.metadata.uid or "",
            campaign.generation,
            source.describe() if source else "items",
        )
        if memory.items_key == cache_key:
            return memory.items
        items: Sequence[Item]
        if source is None:
            items = campaign.spec.items or []
            check_inline(items)
            check(items, campaign, "spec.items")
            check_batch_lines_of(campaign, items, "spec.items")
        elif source.object is not None:
            items = self.streamed(campaign, source.object)  # checked as it is counted
        else:
            items = configmap_items(self.kube, campaign)
            check(items, campaign, f"ConfigMap {source.config_map_name}")
            check_batch_lines_of(campaign, items, f"ConfigMap {source.config_map_name} key {source.key}")
        memory.items_key, memory.items = cache_key, items
        return items

    def streamed(self, campaign: Campaign, source: ItemsObject) -> StreamedItems:
        """The items of an object in the campaign's S3 store, counted (every line checked) now and
        later read slice by slice as shards are cut: memory follows the window, not the file."""
        location = campaign.current_status.result_store or resolve_result_store(
            campaign.spec.result_store, self.stores.installation
        )
        items = object_items(
            source,
            self.stores.s3_of(campaign.namespace, location),
            campaign.spec.shard_size,
            campaign.current_status.items_pin,
        )
        try:
            items.total()
        except (ShardItemsTooLarge, NotJsonlText) as error:
            raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_INVALID, str(error)) from None
        except ValueError as error:
            raise campaigns.ItemsUnavailable(
                ConditionReason.ITEMS_INVALID, f"{error}; fix that line in {items.where}"
            ) from None
        except StoreUnavailable as error:
            raise campaigns.ItemsUnavailable(ConditionReason.RESULT_STORE_UNAVAILABLE, str(error)) from None
        return items


def check(items: Sequence[Item], campaign: Campaign, where: str) -> None:
    """Every shard's items fit in one Shard object; ItemsUnavailable (ItemsInvalid) naming `where`."""
    try:
        check_shard_items(items, campaign.spec.shard_size, where)
    except ShardItemsTooLarge as error:
        raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_INVALID, str(error)) from None
