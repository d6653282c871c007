"""The items a pass reads (scheduler/items.py), through the reconcile: a bad input is reported
naming the fix, before anything is created."""

from __future__ import annotations

from testbed.upstream import batch_line

from shardops.k8s.api import (
    CONFIGMAPS,
    JOBS,
)
from tests.schedulerkit import (
    NAMESPACE,
    Clock,
    OperatorKube,
    campaign,
    condition,
    names,
    put_campaign,
    run,
    status_of,
)


def test_missing_items_configmap_is_reported_and_nothing_is_created(kube: OperatorKube, clock: Clock) -> None:
    body = campaign(items=None)
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    put_campaign(kube, body)
    run(kube, clock)
    run(kube, clock.advance(5))
    status = status_of(kube)
    ready = condition(status, "Ready")
    assert status["phase"] == "Invalid"
    assert (ready["status"], ready["reason"]) == ("False", "ItemsNotFound")
    assert "create it" in ready["message"] and ready["observedGeneration"] == 1
    assert names(kube) == [] and names(kube, JOBS) == []
    assert kube.event_reasons("camp") == ["ItemsNotFound"], "one Event per problem, not per pass"


def test_malformed_jsonl_names_the_line(kube: OperatorKube, clock: Clock) -> None:
    body = campaign()
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    put_campaign(kube, body)
    kube.put(
        CONFIGMAPS,
        NAMESPACE,
        {"metadata": {"name": "questions"}, "data": {"items.jsonl": '{"a":1}\n\n{oops\n'}},
    )
    run(kube, clock)
    ready = condition(status_of(kube), "Ready")
    assert ready["reason"] == "ItemsInvalid" and "line 3" in ready["message"]
    assert names(kube) == []


def test_items_too_big_for_a_shard_are_reported_before_any_shard_is_cut(
    kube: OperatorKube, clock: Clock
) -> None:
    # Each item fits; three of them in one shard would not fit its Shard object (the API server
    # would refuse its create, 413, pass after pass). Said up front, with the shardSize that fits.
    body = campaign(items=[{"n": i, "pad": "x" * 400_000} for i in range(4)], shardSize=3)
    put_campaign(kube, body)
    run(kube, clock)
    run(kube, clock.advance(5))
    status = status_of(kube)
    ready = condition(status, "Ready")
    assert status["phase"] == "Invalid" and ready["reason"] == "ItemsInvalid"
    assert "spec.items: the items of shard 0 pass 1,048,576 bytes at item 2" in ready["message"]
    assert "lower spec.shardSize (about 2 items of this size fit)" in ready["message"]
    assert names(kube) == [] and names(kube, JOBS) == []
    assert kube.event_reasons("camp") == ["ItemsInvalid"]


def test_items_are_read_once_per_spec_generation(kube: OperatorKube) -> None:
    from shardops.api.campaign import Campaign
    from shardops.api.enums import StoreType
    from shardops.api.store import ResultStoreStatus
    from shardops.scheduler.items import Items
    from shardops.scheduler.memory import Memory
    from shardops.store.installation import Stores

    kube.put(CONFIGMAPS, NAMESPACE, {"metadata": {"name": "inputs"}, "data": {"items.jsonl": '{"n": 1}\n'}})
    body = campaign()
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "inputs", "key": "items.jsonl"}
    body["metadata"]["namespace"] = NAMESPACE
    items = Items(kube, Stores(ResultStoreStatus(type=StoreType.CONFIG_MAP)))  # type: ignore[arg-type]
    memory = Memory()
    assert list(items.read(Campaign.parse(body), memory)) == [{"n": 1}]
    kube.put(CONFIGMAPS, NAMESPACE, {"metadata": {"name": "inputs"}, "data": {"items.jsonl": '{"n": 2}\n'}})
    assert list(items.read(Campaign.parse(body), memory)) == [{"n": 1}], "same generation: not read again"
    body["metadata"]["generation"] = 2
    assert list(items.read(Campaign.parse(body), memory)) == [{"n": 2}], "a new generation reads again"


def test_a_repeated_custom_id_of_inline_batch_lines_is_reported_naming_both_lines(
    kube: OperatorKube, clock: Clock
) -> None:
    def line(custom_id: str) -> dict[str, object]:
        return batch_line(custom_id, {"input": "x"}, url="/v1/embeddings")

    llm = {"baseUrl": "http://upstream/v1", "model": "m", "format": "openai-batch"}
    body = campaign(items=[line("a"), line("b"), line("a")])
    body["spec"]["worker"] = {"image": "shardops:dev", "command": ["shardops", "llm"], "llm": llm}
    put_campaign(kube, body)
    run(kube, clock)
    status = status_of(kube)
    ready = condition(status, "Ready")
    assert status["phase"] == "Invalid" and ready["reason"] == "ItemsInvalid"
    assert "spec.items line 3: custom_id 'a' is already the custom_id of line 1" in ready["message"]
    assert names(kube) == [] and names(kube, JOBS) == []
