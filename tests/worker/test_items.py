"""A shard's items as a claim reads them (worker.items): inline, or a slice of an itemsFrom ConfigMap."""

from __future__ import annotations

from typing import Any

import pytest

from shardops.api.campaign import Campaign
from shardops.api.shard import Shard
from shardops.k8s.api import CONFIGMAPS
from shardops.worker.items import ShardItems
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE, campaign_body


def _campaign(**spec: Any) -> Campaign:
    body = campaign_body(**spec)
    body["metadata"]["uid"] = "u1"
    if "itemsFrom" in spec:
        del body["spec"]["items"]
    return Campaign.parse(body)


def _shard(**spec: Any) -> Shard:
    body = {"campaign": "camp", "index": 0, "idempotencyKey": "k", **spec}
    return Shard.parse({"metadata": {"name": "camp-00000", "namespace": NAMESPACE}, "spec": body})


def test_inline_items_are_the_shards_own() -> None:
    items = ShardItems(FakeKube(), NAMESPACE)
    assert items.of(_campaign(), _shard(items=[{"id": 7}])) == [{"id": 7}]


def test_a_configmap_slice_is_read_once_per_campaign_and_cut_by_the_range() -> None:
    kube = FakeKube()
    kube.put(
        CONFIGMAPS,
        NAMESPACE,
        {"metadata": {"name": "input"}, "data": {"items.jsonl": '{"n":0}\n{"n":1}\n{"n":2}\n'}},
    )
    campaign = _campaign(itemsFrom={"configMapName": "input", "key": "items.jsonl"})
    items = ShardItems(kube, NAMESPACE)
    assert items.of(campaign, _shard(itemRange={"start": 1, "end": 3})) == [{"n": 1}, {"n": 2}]
    kube.delete(CONFIGMAPS, NAMESPACE, "input")
    # Parsed once: the next shard's slice needs no second read (the ConfigMap is gone now).
    assert items.of(campaign, _shard(itemRange={"start": 0, "end": 1})) == [{"n": 0}]


def test_a_shard_parsed_without_its_items_is_refused_not_run_empty() -> None:
    lean = Shard.parse_items_counted(
        {
            "metadata": {"name": "camp-00000"},
            "spec": {"campaign": "camp", "index": 0, "idempotencyKey": "k", "items": [{"id": 1}]},
        }
    )
    with pytest.raises(ValueError, match="parsed without its items"):
        ShardItems(FakeKube(), NAMESPACE).of(_campaign(), lean)
