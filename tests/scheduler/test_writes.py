"""A pass's writes to Shards (scheduler/writes.py): each that lands replaces the shard in what the
pass observed; one that conflicts is left for the next pass."""

from __future__ import annotations

from shardops.api.campaign import Campaign
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.k8s.api import CAMPAIGNS, SHARDS
from shardops.k8s.shards import Actor, TransitionRequest
from shardops.logic.transitions import Action
from shardops.scheduler import builders
from shardops.scheduler.observed import Observed
from shardops.scheduler.writes import ShardWrites
from tests.schedulerkit import NAMESPACE, T0, OperatorKube, campaign, put_campaign, put_shard, shard, shard_of

ACTOR = Actor(controller="shardops.dev/operator", instance="op-test")


def _seen(kube: OperatorKube) -> Observed:
    body = put_campaign(kube, campaign(items=[{"id": 0}, {"id": 1}]))
    parsed = Campaign.parse(body)
    shards = {s["metadata"]["name"]: Shard.parse(s) for s in kube.list(SHARDS, NAMESPACE)}
    return Observed(body, parsed, list(parsed.spec.items or []), shards, [], [])


def test_a_transition_that_lands_replaces_the_shard_in_the_observation() -> None:
    kube = OperatorKube()
    put_shard(kube, shard("camp", 0, "Queued"))
    seen = _seen(kube)
    writes = ShardWrites(kube, ACTOR)  # type: ignore[arg-type]
    assert writes.transition_named(seen, "camp-00000", TransitionRequest(Action.MATERIALIZE, "claimable"), T0)
    assert seen.shards["camp-00000"].phase is ShardPhase.PENDING
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Pending"
    assert not writes.transition_named(seen, "camp-00009", TransitionRequest(Action.PAUSE, "no such"), T0)


def test_a_transition_on_a_shard_that_moved_meanwhile_is_left_for_the_next_pass() -> None:
    kube = OperatorKube()
    put_shard(kube, shard("camp", 0, "Queued"))
    seen = _seen(kube)
    stale = seen.shards["camp-00000"]
    moved = shard_of(kube, "camp-00000")
    moved["metadata"].setdefault("labels", {})["touched"] = "yes"
    kube.put(SHARDS, NAMESPACE, moved)  # a new resourceVersion: the pass's copy is stale
    writes = ShardWrites(kube, ACTOR)  # type: ignore[arg-type]
    assert not writes.transition(seen, stale, TransitionRequest(Action.MATERIALIZE, "claimable"), T0)
    assert seen.shards["camp-00000"] is stale
    assert shard_of(kube, "camp-00000")["status"]["phase"] == "Queued"


def test_a_shard_created_by_an_earlier_pass_is_taken_as_it_is() -> None:
    kube = OperatorKube()
    seen = _seen(kube)
    writes = ShardWrites(kube, ACTOR)  # type: ignore[arg-type]
    body = builders.shard_body(seen.campaign, 0, seen.items)
    created = writes.create(seen, body)
    assert created is not None and "camp-00000" in seen.shards
    again = writes.create(seen, builders.shard_body(seen.campaign, 0, seen.items))
    assert again is not None and again.name == created.name, "AlreadyExists: adopted, still Queued"
    assert len(kube.list(SHARDS, NAMESPACE)) == 1
    assert kube.obj(CAMPAIGNS, NAMESPACE, "camp") is not None
