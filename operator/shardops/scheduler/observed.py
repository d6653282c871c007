"""What one pass saw (`Observed`): the Campaign, its items, its Shards, worker Jobs and their pods.

Read once at the start of a pass (`observe`); the pass's own writes update `shards` and `jobs` as
they land, so later steps of the same pass decide from what is now there. `state/observe.py` turns
it into the planner's inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shardops.api.campaign import Campaign
from shardops.api.common import JSON, Item
from shardops.api.shard import Shard
from shardops.k8s import jobs
from shardops.k8s.api import KubeClient
from shardops.k8s.shards import list_shards
from shardops.state import ledger, shardview


@dataclass
class Observed:
    body: JSON
    campaign: Campaign
    # Inline items, a ConfigMap's, or an object's read as a stream (store.items.StreamedItems).
    items: Sequence[Item]
    shards: dict[str, Shard]
    jobs: list[JSON]
    pods: list[JSON]
    # Listed Shards already folded into the ledger (a pass stopped before deleting them): deleted,
    # never counted again.
    leftovers: list[Shard] = field(default_factory=list)

    @property
    def key(self) -> str:
        """namespace/name: how metrics and logs name the campaign."""
        return f"{self.campaign.namespace}/{self.campaign.name}"


def observe(kube: KubeClient, body: JSON, campaign: Campaign, items: Sequence[Item]) -> Observed:
    """List the campaign's Shards, worker Jobs and pods.

    Bounded by the window once Done shards are folded: the live shards plus the Done ones of the
    last pass (and, with the ConfigMap store, which does not fold, its at most 1000 shards)."""
    namespace, name = campaign.namespace, campaign.name
    listed = shardview.of_campaign(list_shards(kube, namespace, name), campaign)
    folded = campaign.current_status.folded
    return Observed(
        body=body,
        campaign=campaign,
        items=items,
        shards={s.name: s for s in ledger.unfolded(listed, folded)},
        jobs=jobs.list_workers(kube, namespace, name),
        pods=jobs.list_worker_pods(kube, namespace, name),
        leftovers=[s for s in listed if ledger.is_folded(s, folded)],
    )
