"""Builders for worker and result-store tests: a campaign and its shards in Pending, as the operator
makes them, stored in the in-memory API server (`fakekube.FakeKube`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fakekube import FakeKube
from shardops.api.names import CAMPAIGN_LABEL
from shardops.api.shard import Shard
from shardops.k8s.api import CAMPAIGNS, SHARDS
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.logic.idempotency import idempotency_key
from shardops.logic.transitions import Action

JSON = dict[str, Any]


# --- builders -------------------------------------------------------------------------------------

NAMESPACE = "ns"
OPERATOR = Actor("shardops.dev/operator", "test")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def campaign_body(name: str = "camp", items: list[JSON] | None = None, **spec: Any) -> JSON:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": name},
        "spec": {
            "items": items if items is not None else [{"id": i} for i in range(4)],
            "shardSize": 2,
            "leaseSeconds": 10,
            "heartbeatSeconds": 1,
            "idleSeconds": 0,
            "worker": {"image": "x", "command": ["true"]},
            **spec,
        },
    }


def add_campaign(kube: FakeKube, body: JSON) -> list[Shard]:
    """The Campaign and its shards in Pending, as the operator makes them."""
    kube.put(CAMPAIGNS, NAMESPACE, body)
    name = body["metadata"]["name"]
    size = body["spec"]["shardSize"]
    items = body["spec"]["items"]
    command = body["spec"]["worker"]["command"]
    shards = []
    for index, start in enumerate(range(0, len(items), size)):
        part = items[start : start + size]
        created = kube.put(
            SHARDS,
            NAMESPACE,
            {
                "apiVersion": "shardops.dev/v1alpha1",
                "kind": "Shard",
                "metadata": {"name": f"{name}-{index:05d}", "labels": {CAMPAIGN_LABEL: name}},
                "spec": {
                    "campaign": name,
                    "index": index,
                    "items": part,
                    "itemRange": {"start": start, "end": start + len(part)},
                    "idempotencyKey": idempotency_key(name, part, command),
                },
            },
        )
        shards.append(
            apply_transition(
                kube,  # type: ignore[arg-type]
                Shard.parse(created),
                TransitionRequest(Action.MATERIALIZE, "test"),
                OPERATOR,
                T0,
            )
        )
    # The operator records how many shards it cut: workers list only the unfinished ones.
    recorded = kube.obj(CAMPAIGNS, NAMESPACE, name)
    assert recorded is not None
    status = {**(recorded.get("status") or {}), "cutShards": len(shards)}
    kube.put(CAMPAIGNS, NAMESPACE, {**recorded, "status": status})
    return shards
