"""A campaign whose items cannot be read (itemsFrom naming a missing ConfigMap, a malformed JSONL
line) gets Ready=False with the reason and an Event naming the fix, and nothing is created; once
fixed it runs."""

from __future__ import annotations

import pytest
from testbed.bed import Bed

from shardops.api.common import JSON
from shardops.k8s.api import CONFIGMAPS, EVENTS, JOBS

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")


def _ready(bed: Bed, reason: str) -> JSON | None:
    body = bed.get_campaign("fromcm")
    found = bed.condition(body, "Ready")
    return body if found and found["reason"] == reason else None


def test_unreadable_items_are_reported_with_the_fix_and_nothing_is_created(bed: Bed) -> None:
    kube = bed.kube
    body = bed.campaign_body("fromcm", [], shardSize=2)
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    with bed.operator():
        bed.create_campaign(body)

        missing = bed.wait_for("Ready=False ItemsNotFound", lambda: _ready(bed, "ItemsNotFound"))
        ready = bed.condition(missing, "Ready")
        assert ready["status"] == "False" and missing["status"]["phase"] == "Invalid"
        assert "questions" in ready["message"] and "create it" in ready["message"]
        assert ready["observedGeneration"] == missing["metadata"]["generation"]

        lines = ['{"q": 1}', '{"q": 2}', '{"q": 3', '{"q": 4}']
        kube.create(
            CONFIGMAPS,
            bed.namespace,
            {"metadata": {"name": "questions"}, "data": {"items.jsonl": "\n".join(lines)}},
        )
        malformed = bed.wait_for("Ready=False ItemsInvalid", lambda: _ready(bed, "ItemsInvalid"))
        message = bed.condition(malformed, "Ready")["message"]
        assert "line 3" in message and "not valid JSON" in message, message

        # Reported, not acted on: no shard, no worker.
        assert bed.shards() == []
        assert kube.list(JOBS, bed.namespace) == []

        def warnings() -> dict[str, str] | None:
            found = {
                e["reason"]: e["note"]
                for e in kube.list(EVENTS, bed.namespace)
                if e["regarding"]["name"] == "fromcm" and e["type"] == "Warning"
            }
            return found if {"ItemsNotFound", "ItemsInvalid"} <= set(found) else None

        # The Event follows the status write that set the condition: wait for it, not just the status.
        notes = bed.wait_for("an Event for each reason", warnings)
        assert "create it" in notes["ItemsNotFound"] and "line 3" in notes["ItemsInvalid"]
        # One Event per problem, not one per reconcile.
        per_reason = [
            e["reason"] for e in kube.list(EVENTS, bed.namespace) if e["regarding"]["name"] == "fromcm"
        ]
        assert per_reason.count("ItemsNotFound") == 1 and per_reason.count("ItemsInvalid") == 1, per_reason

        lines[2] = '{"q": 3}'
        kube.patch(CONFIGMAPS, bed.namespace, "questions", {"data": {"items.jsonl": "\n".join(lines)}})
        final = bed.wait_phase("fromcm", {"Succeeded", "Completed"}, timeout=120)

    assert final["status"]["phase"] == "Succeeded"
    assert bed.condition(final, "Ready")["status"] == "True"
    assert final["status"]["itemsTotal"] == 4 and final["status"]["counts"]["done"] == 2
    print(
        "\nReady=False reasons reported in turn: ItemsNotFound, ItemsInvalid; "
        f"then {final['status']['phase']}"
    )
