"""The writes a pass makes to Shards (`ShardWrites`): transitions and creates.

Every shard transition goes through `k8s.shards.apply_transition` (resourceVersion precondition +
Event). A Conflict on one shard means it moved meanwhile: it is left for the next pass. Each write
that lands replaces the shard in the pass's `Observed`, so later steps decide from what is there."""

from __future__ import annotations

import datetime as dt
import logging

from shardops.api.common import JSON
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.k8s.api import SHARDS, AlreadyExists, ApiError, Conflict, KubeClient, NotFound
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.scheduler.observed import Observed
from shardops.state import shardview

log = logging.getLogger(__name__)

CONFLICT_ROUNDS = 3


class ShardWrites:
    def __init__(self, kube: KubeClient, actor: Actor) -> None:
        self.kube = kube
        self.actor = actor

    def transition(self, seen: Observed, shard: Shard, request: TransitionRequest, now: dt.datetime) -> bool:
        """Apply one transition. A Conflict means the shard moved since we read it: left for the next pass."""
        try:
            updated = apply_transition(self.kube, shard, request, self.actor, now)
        except (Conflict, NotFound):
            return False
        seen.shards[updated.name] = updated
        return True

    def transition_named(
        self, seen: Observed, name: str, request: TransitionRequest, now: dt.datetime
    ) -> bool:
        shard = seen.shards.get(name)
        return shard is not None and self.transition(seen, shard, request, now)

    def transition_claim(
        self, seen: Observed, shard: Shard, request: TransitionRequest, now: dt.datetime
    ) -> bool:
        """Apply `request` to the shard as it is now, while it still shows the claim it was decided on."""
        then = shard.current_status
        for _ in range(CONFLICT_ROUNDS):
            try:
                fresh = Shard.parse(self.kube.get(SHARDS, shard.namespace, shard.name))
            except NotFound:
                return False
            status = fresh.current_status
            same = (status.owner, status.attempt) == (then.owner, then.attempt)
            if fresh.phase is not ShardPhase.RUNNING or not same:
                return False
            if self.transition(seen, fresh, request, now):
                return True
        return False

    def create(self, seen: Observed, body: JSON) -> Shard | None:
        """Create a Shard; the shard to make Pending, or None (not created, or already past Queued)."""
        campaign = seen.campaign
        name = body["metadata"]["name"]
        try:
            created = self.kube.create(SHARDS, campaign.namespace, body)
        except AlreadyExists:
            # A previous pass created it and stopped before materializing: take it as it is. Unless
            # it is a deleted campaign's of the same name: the garbage collector removes it, the
            # shard is cut again after that.
            try:
                created = self.kube.get(SHARDS, campaign.namespace, name)
            except NotFound:
                return None
            if not shardview.of_campaign([Shard.parse(created)], campaign):
                log.info(
                    "shard %s/%s is a deleted campaign's of the same name: cut once it is gone",
                    campaign.namespace,
                    name,
                )
                return None
        except ApiError as error:
            log.error("creating shard %s/%s failed: %s", campaign.namespace, name, error)
            return None
        shard = Shard.parse(created)
        seen.shards[shard.name] = shard
        if shard.phase not in (None, ShardPhase.QUEUED):
            return None
        return shard
