"""A campaign whose items cannot be read (itemsFrom naming a missing ConfigMap, a malformed JSONL
line) gets Ready=False with the reason and an Event naming the fix, and nothing is created; once
fixed it runs."""

from __future__ import annotations

import pytest
from testbed.harness import Cluster, wait_for
from testbed.kits.scheduler import (
    JSON,
    campaign_body,
    condition,
    create_campaign,
    get_campaign,
    kube_for,
    operator_running,
    shards_of,
    wait_phase,
)

from shardops.k8s.api import CONFIGMAPS, EVENTS, JOBS, Kube

pytestmark = pytest.mark.usefixtures("crds_installed")


def _ready(kube: Kube, namespace: str, reason: str) -> JSON | None:
    body = get_campaign(kube, namespace, "fromcm")
    found = condition(body, "Ready")
    return body if found and found["reason"] == reason else None


def test_unreadable_items_are_reported_with_the_fix_and_nothing_is_created(
    local_cluster: Cluster, namespace: str
) -> None:
    kube = kube_for(local_cluster)
    body = campaign_body("fromcm", [], shardSize=2)
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    with operator_running(local_cluster, namespace):
        create_campaign(kube, namespace, body)

        missing = wait_for("Ready=False ItemsNotFound", lambda: _ready(kube, namespace, "ItemsNotFound"))
        ready = condition(missing, "Ready")
        assert ready["status"] == "False" and missing["status"]["phase"] == "Invalid"
        assert "questions" in ready["message"] and "create it" in ready["message"]
        assert ready["observedGeneration"] == missing["metadata"]["generation"]

        lines = ['{"q": 1}', '{"q": 2}', '{"q": 3', '{"q": 4}']
        kube.create(
            CONFIGMAPS,
            namespace,
            {"metadata": {"name": "questions"}, "data": {"items.jsonl": "\n".join(lines)}},
        )
        malformed = wait_for("Ready=False ItemsInvalid", lambda: _ready(kube, namespace, "ItemsInvalid"))
        message = condition(malformed, "Ready")["message"]
        assert "line 3" in message and "not valid JSON" in message, message

        # Reported, not acted on: no shard, no worker.
        assert shards_of(kube, namespace) == []
        assert kube.list(JOBS, namespace) == []

        def warnings() -> dict[str, str] | None:
            found = {
                e["reason"]: e["note"]
                for e in kube.list(EVENTS, namespace)
                if e["regarding"]["name"] == "fromcm" and e["type"] == "Warning"
            }
            return found if {"ItemsNotFound", "ItemsInvalid"} <= set(found) else None

        # The Event follows the status write that set the condition: wait for it, not just the status.
        notes = wait_for("an Event for each reason", warnings)
        assert "create it" in notes["ItemsNotFound"] and "line 3" in notes["ItemsInvalid"]
        # One Event per problem, not one per reconcile.
        per_reason = [e["reason"] for e in kube.list(EVENTS, namespace) if e["regarding"]["name"] == "fromcm"]
        assert per_reason.count("ItemsNotFound") == 1 and per_reason.count("ItemsInvalid") == 1, per_reason

        lines[2] = '{"q": 3}'
        kube.patch(CONFIGMAPS, namespace, "questions", {"data": {"items.jsonl": "\n".join(lines)}})
        final = wait_phase(kube, namespace, "fromcm", {"Succeeded", "Completed"}, timeout=120)

    assert final["status"]["phase"] == "Succeeded"
    assert condition(final, "Ready")["status"] == "True"
    assert final["status"]["itemsTotal"] == 4 and final["status"]["counts"]["done"] == 2
    print(
        "\nReady=False reasons reported in turn: ItemsNotFound, ItemsInvalid; "
        f"then {final['status']['phase']}"
    )
