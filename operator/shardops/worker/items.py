"""What a claim reads of a shard's work: its items (`ShardItems`: inline, or a slice of the campaign's
itemsFrom ConfigMap) and the item results already stored for them (`stored_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shardops.api.campaign import Campaign
from shardops.api.common import Item
from shardops.api.shard import Shard
from shardops.k8s.api import CONFIGMAPS, KubeClient
from shardops.logic.idempotency import item_subkey
from shardops.store import ResultStore
from shardops.store.records import ItemRecord
from shardops.worker.logs import log


@dataclass
class ShardItems:
    """The items of a slot's shards, read through its API client."""

    kube: KubeClient
    namespace: str
    # Each itemsFrom ConfigMap read, parsed, by (campaign uid, ConfigMap, key): a slot serves one
    # campaign, so one entry per incarnation of it that it saw.
    _parsed: dict[tuple[str, str, str], list[Item]] = field(default_factory=dict)

    def of(self, campaign: Campaign, shard: Shard) -> list[Item]:
        """The shard's items: inline, or its slice of the campaign's itemsFrom ConfigMap."""
        if shard.spec.items_left_out:
            # A lean listing's shard reads as having no items: running it would compute nothing.
            raise ValueError(f"{shard.name}: parsed without its items; claim takes Shard.with_items()")
        if shard.spec.items is not None:
            return list(shard.spec.items)
        source = campaign.spec.items_from
        # Shards carry their items since they are cut; only Shards of old versions point at a
        # ConfigMap slice (never at an object: those Shards always carry theirs).
        if (
            shard.spec.item_range is None
            or source is None
            or source.config_map_name is None
            or not source.key
        ):
            return []
        cache_key = (campaign.metadata.uid or "", source.config_map_name, source.key)
        if cache_key not in self._parsed:
            configmap = self.kube.get(CONFIGMAPS, self.namespace, source.config_map_name)
            text = (configmap.get("data") or {}).get(source.key, "")
            self._parsed[cache_key] = source.parse_items(text)
        every = self._parsed[cache_key]
        return every[shard.spec.item_range.start : shard.spec.item_range.end]


def stored_of(store: ResultStore, shard: Shard, items: Sequence[Item]) -> dict[str, ItemRecord]:
    """The item results of `items` stored under the shard's idempotency key that verify; the others
    are computed again."""
    found, corrupt = store.read_items(shard.spec.idempotency_key, [item_subkey(i) for i in items])
    if corrupt:
        log.warning(
            "%s: %d stored item result(s) failed verification; recomputing them", shard.name, len(corrupt)
        )
    return found
