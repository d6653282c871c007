"""Shard transitions (k8s/shards.py): what one writes to the API server."""

from __future__ import annotations

from shardops.api.enums import ErrorClass
from shardops.api.shard import Shard, ShardError
from shardops.k8s.api import SHARDS
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.logic.transitions import Action
from tests.schedulerkit import NAMESPACE, T0, OperatorKube, entry, put_shard, shard


def test_a_shard_that_fails_is_one_status_write_naming_its_campaigns_event_and_posts_none() -> None:
    """Issue 31: an Event per failed shard kept one per shard alive for an hour; the shard names the
    campaign's Event for the reason, which the operator's pass raises (`events.EventSeries`)."""
    kube = OperatorKube()
    put_shard(kube, shard("camp", 7, "Running", attempt=1, history=[entry("Running", T0, "Claimed")]))
    running = Shard.parse(kube.get(SHARDS, NAMESPACE, "camp-00007"))
    error = ShardError.model_validate(
        {"class": ErrorClass.INVALID_INPUT, "message": "item 70 is not valid JSON"}
    )
    request = TransitionRequest(Action.FAIL_FINAL, "invalid input", {"last_error": error})
    failed = apply_transition(kube, running, request, Actor(controller="c", instance="w-1"), T0)
    status = failed.current_status
    assert status.last_error is not None and status.last_error.event == "camp.failed"
    assert status.history[-1].event == "camp.failed"
    assert [entry[1] for entry in kube.write_log()] == ["shards"], "no Event written"
