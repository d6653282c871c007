"""Result stores: where shard results and the item results for resuming are kept.

Two implementations of one interface (`ResultStore`): ConfigMaps (zero dependencies, small
campaigns) and S3 (any volume). Which one a campaign uses is recorded in its status
(`status.resultStore`) before its first shard is cut; `open_store` opens that one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from shardops.api.campaign import Campaign
from shardops.api.enums import StoreType
from shardops.api.store import CONFIGMAP_STORE_MAX_SHARDS, ResultStoreStatus
from shardops.k8s.api import KubeClient
from shardops.store.records import ItemRecord, ResultMeta, StoredResult, StoreUnavailable

__all__ = ["ResultStore", "StoreUnavailable", "capacity_problem", "location_of", "open_store"]


class ResultStore(Protocol):
    """What the worker and the CLI need of a store; every method may raise StoreUnavailable."""

    type: StoreType
    max_bytes: int

    def describe(self) -> str: ...

    def read_result(self, key: str) -> StoredResult | None:
        """The key's result if one is stored and verifies; StoreCorrupt when present but invalid."""
        ...

    def store_result(
        self, key: str, text: str, meta: ResultMeta, item_count: int
    ) -> tuple[StoredResult, bool]:
        """Store a claim's result; (stored, True) when a result of the key was there already."""
        ...

    def commit(self, key: str, stored: StoredResult) -> None:
        """After the claim's fenced Done write: make `stored` the key's result for later reuse."""
        ...

    def find_result(self, key: str, token: int | None, *, committed: bool = True) -> StoredResult | None:
        """The key's result, or the whole result the claim with fencing token `token` stored before
        its Done write was lost, verified; None when there is neither. At most two reads (O(1) per
        shard); StoreCorrupt when one is present but does not verify. `committed=False`: only the
        claim's own (the key's committed result is one this claim must not finish with: a rerun
        of its errored items, status.rerunErrored)."""
        ...

    def read_ref(self, ref: str, key: str) -> StoredResult:
        """The verified result a Done shard's status.result.ref names."""
        ...

    def read_items(self, key: str, wanted: Iterable[str]) -> tuple[dict[str, ItemRecord], list[str]]: ...

    def save_items(
        self, key: str, campaign: str, records: Mapping[str, ItemRecord], shard: str, token: int
    ) -> int: ...


CONFIGMAP_LOCATION = ResultStoreStatus(type=StoreType.CONFIG_MAP)


def location_of(campaign: Campaign) -> ResultStoreStatus:
    """The store the campaign's status records; ConfigMap for campaigns from before it was recorded."""
    return campaign.current_status.result_store or CONFIGMAP_LOCATION


def open_store(
    kube: KubeClient, namespace: str, location: ResultStoreStatus, max_bytes: int | None = None
) -> ResultStore:
    """The store at `location` for `namespace`; `max_bytes` overrides the store's own size cap."""
    if location.type is StoreType.S3:
        from shardops.store.s3 import DEFAULT_MAX_BYTES as S3_MAX
        from shardops.store.s3 import S3Store

        return S3Store(location, namespace, max_bytes=max_bytes or S3_MAX)
    from shardops.store.configmap import DEFAULT_MAX_BYTES as CONFIGMAP_MAX
    from shardops.store.configmap import ConfigMapStore

    return ConfigMapStore(kube, namespace, max_bytes=max_bytes or CONFIGMAP_MAX)


def capacity_problem(location: ResultStoreStatus, work_shards: int) -> str | None:
    """Why the store cannot hold this campaign's results, naming the fix; None when it can."""
    if location.type is StoreType.CONFIG_MAP and work_shards > CONFIGMAP_STORE_MAX_SHARDS:
        return (
            f"the campaign has {work_shards} work shards and its result store is ConfigMap, which holds "
            f"at most {CONFIGMAP_STORE_MAX_SHARDS} (two ConfigMaps of results per shard in etcd, which has "
            "a 2 GiB quota for the whole cluster): configure object storage (spec.resultStore.type: S3, or "
            "the chart's resultStore.type: S3) or use a larger spec.shardSize"
        )
    if location.type is StoreType.S3 and not location.bucket:
        return (
            "the result store is S3 but no bucket is configured: set spec.resultStore.s3.bucket or the "
            "chart's resultStore.s3.bucket"
        )
    return None
