"""The shardops API: pydantic models of Campaign and Shard, the single source of the CRDs.

Import models from here; `shardops.api.crdgen` turns them into `crds/*.yaml`.
"""

from shardops.api.campaign import (
    BreakerStatus,
    Budget,
    Campaign,
    CampaignSpec,
    CampaignStatus,
    RetryRequest,
    ShardCounts,
)
from shardops.api.common import Condition, ObjectMeta, find_condition, set_condition
from shardops.api.enums import (
    BreakerState,
    CampaignPhase,
    ErrorClass,
    ShardClass,
    ShardPhase,
    StallPolicy,
)
from shardops.api.items import ItemsFrom
from shardops.api.shard import (
    HISTORY_LIMIT,
    HistoryEntry,
    ItemRange,
    Progress,
    Shard,
    ShardError,
    ShardResult,
    ShardSpec,
    ShardStatus,
)
from shardops.api.sources import Backoff, Source, Stall
from shardops.api.worker import EnvVar, ItemsWorkerSpec, ResourceRequirements, WorkerSpec

__all__ = [
    "HISTORY_LIMIT",
    "Backoff",
    "BreakerState",
    "BreakerStatus",
    "Budget",
    "Campaign",
    "CampaignPhase",
    "CampaignSpec",
    "CampaignStatus",
    "Condition",
    "EnvVar",
    "ErrorClass",
    "HistoryEntry",
    "ItemRange",
    "ItemsFrom",
    "ItemsWorkerSpec",
    "ObjectMeta",
    "Progress",
    "ResourceRequirements",
    "RetryRequest",
    "Shard",
    "ShardClass",
    "ShardCounts",
    "ShardError",
    "ShardPhase",
    "ShardResult",
    "ShardSpec",
    "ShardStatus",
    "Source",
    "Stall",
    "StallPolicy",
    "WorkerSpec",
    "find_condition",
    "set_condition",
]
