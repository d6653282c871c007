"""The Batch API's objects from Campaigns: status and request_counts from the phase and counts, ids,
the Campaign a batch is (valid as the API's own model), pagination."""

from __future__ import annotations

from typing import Any

import pytest

from shardops.api.campaign import Campaign
from shardops.api.names import CANCELLED_ANNOTATION
from shardops.batchapi import objects
from shardops.batchapi.objects import ApiProblem, BatchDefaults, BatchRequest

DIGEST = "ab" * 32
DEFAULTS = BatchDefaults("ClusterSource", "team-llm", "shardops:dev", 50, 4)
REQUEST = BatchRequest(f"file-{DIGEST}", "/v1/chat/completions", "24h", {"run": "nightly"})


def _batch(name: str = "batch-1", created: str = "2026-03-01T10:00:00Z", **status: Any) -> Campaign:
    body = objects.batch_campaign(
        name, "team-a", REQUEST, f"p/team-a/inputs/x/{DIGEST}.jsonl", "results", DEFAULTS
    )
    body["metadata"]["creationTimestamp"] = created
    body["metadata"]["generation"] = 2
    status.setdefault("observedGeneration", 2)
    body["status"] = status
    annotations = status.pop("annotations", None)
    if annotations:
        body["metadata"]["annotations"].update(annotations)
    return Campaign.parse(body)


def test_a_batch_is_a_valid_campaign_of_batch_lines_through_the_named_source() -> None:
    campaign = _batch()
    assert campaign.spec.worker.llm is not None and str(campaign.spec.worker.llm.format) == "openai-batch"
    assert campaign.spec.items_from is not None and campaign.spec.items_from.object is not None
    assert campaign.spec.items_from.object.key.endswith(f"{DIGEST}.jsonl")
    (source,) = campaign.spec.sources
    assert source.source_ref is not None and (str(source.source_ref.kind), source.source_ref.name) == (
        "ClusterSource",
        "team-llm",
    )
    assert objects.is_batch(campaign)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"phase": "Pending"}, "validating"),
        ({"phase": "Running", "itemsTotal": 10}, "in_progress"),
        ({"phase": "Finalizing", "itemsTotal": 10}, "finalizing"),
        ({"phase": "Succeeded", "itemsTotal": 10}, "completed"),
        ({"phase": "Completed", "itemsTotal": 10}, "completed"),
        ({"phase": "Invalid"}, "failed"),
        (
            {
                "phase": "Suspended",
                "itemsTotal": 10,
                "counts": {"running": 1},
                "annotations": {CANCELLED_ANNOTATION: "2026-03-01T10:05:00Z"},
            },
            "cancelling",
        ),
        (
            {
                "phase": "Suspended",
                "itemsTotal": 10,
                "counts": {"pending": 2, "paused": 3},
                "annotations": {CANCELLED_ANNOTATION: "2026-03-01T10:05:00Z"},
            },
            "cancelling",
        ),
        # A status written before the operator saw the suspend: its counts may be out of date.
        (
            {
                "phase": "Running",
                "itemsTotal": 10,
                "observedGeneration": 1,
                "annotations": {CANCELLED_ANNOTATION: "2026-03-01T10:05:00Z"},
            },
            "cancelling",
        ),
        (
            {
                "phase": "Suspended",
                "itemsTotal": 10,
                "counts": {"done": 1, "paused": 5},
                "annotations": {CANCELLED_ANNOTATION: "2026-03-01T10:05:00Z"},
            },
            "cancelled",
        ),
    ],
)
def test_status_follows_the_phase(status: dict[str, Any], expected: str) -> None:
    assert objects.batch_status(_batch(**status)) == expected


def test_request_counts_errored_items_and_gave_up_shards_are_failed() -> None:
    # 120 items in shards of 50: two Done (one errored item), the last (20 items) Failed.
    finished = _batch(phase="Completed", itemsTotal=120, itemsErrored=1, counts={"done": 2, "failed": 1})
    assert objects.request_counts(finished) == {"total": 120, "completed": 99, "failed": 21}
    running = _batch(phase="Running", itemsTotal=120, itemsErrored=3, counts={"done": 1, "running": 2})
    assert objects.request_counts(running) == {"total": 120, "completed": 47, "failed": 3}
    succeeded = _batch(phase="Succeeded", itemsTotal=120, itemsErrored=3, counts={"done": 3})
    assert objects.request_counts(succeeded) == {"total": 120, "completed": 117, "failed": 3}


def test_the_batch_object_names_its_files_once_finished_and_keeps_the_request() -> None:
    running = objects.batch_object(_batch(phase="Running", itemsTotal=3))
    assert running["output_file_id"] is None and running["error_file_id"] is None
    done = objects.batch_object(_batch(phase="Succeeded", itemsTotal=3, counts={"done": 1}))
    assert (done["output_file_id"], done["error_file_id"]) == ("batch-1-output", "batch-1-errors")
    assert (done["endpoint"], done["input_file_id"], done["metadata"]) == (
        "/v1/chat/completions",
        f"file-{DIGEST}",
        {"run": "nightly"},
    )
    assert done["created_at"] == 1772359200


def test_the_openai_package_parses_a_batch_object() -> None:
    from openai.types import Batch

    parsed = Batch.model_validate(
        objects.batch_object(_batch(phase="Succeeded", itemsTotal=3, itemsErrored=1, counts={"done": 1}))
    )
    assert parsed.status == "completed" and parsed.request_counts is not None
    assert parsed.request_counts.failed == 1


def test_file_ids_name_an_input_by_digest_or_a_batchs_output_and_errors() -> None:
    assert objects.parse_file_id(f"file-{DIGEST}") == objects.FileRef("input", digest=DIGEST)
    assert objects.parse_file_id("batch-1-output") == objects.FileRef("output", batch="batch-1")
    assert objects.parse_file_id("batch-1-errors") == objects.FileRef("errors", batch="batch-1")
    for unknown in ("file-abc", "../etc", f"file-{DIGEST}x", "papers-output"):
        with pytest.raises(ApiProblem) as problem:
            objects.parse_file_id(unknown)
        assert problem.value.status == 404


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "input_file_id": "batch-1-output",
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
            "input_file_id",
        ),
        (
            {"input_file_id": f"file-{DIGEST}", "endpoint": "/v1/images", "completion_window": "24h"},
            "endpoint",
        ),
        (
            {"input_file_id": f"file-{DIGEST}", "endpoint": "/v1/embeddings", "completion_window": "1h"},
            "completion_window",
        ),
        (
            {
                "input_file_id": f"file-{DIGEST}",
                "endpoint": "/v1/embeddings",
                "completion_window": "24h",
                "metadata": {"k": 1},
            },
            "metadata",
        ),
    ],
)
def test_a_bad_batch_request_is_a_400_naming_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiProblem) as problem:
        BatchRequest.parse(body)
    assert (problem.value.status, problem.value.param) == (400, param)


def test_pages_go_newest_first_after_the_named_batch() -> None:
    campaigns = [_batch(f"batch-{i}", created=f"2026-03-01T10:0{i}:00Z") for i in range(5)]
    first = objects.batch_page(campaigns, None, 2)
    assert [b["id"] for b in first["data"]] == ["batch-4", "batch-3"] and first["has_more"]
    assert (first["first_id"], first["last_id"]) == ("batch-4", "batch-3")
    last = objects.batch_page(campaigns, "batch-1", 2)
    assert [b["id"] for b in last["data"]] == ["batch-0"] and not last["has_more"]
    with pytest.raises(ApiProblem):
        objects.batch_page(campaigns, "batch-9", 2)
    for bad in ("0", "101", "x"):
        with pytest.raises(ApiProblem):
            objects.page_limit(bad)
    assert objects.page_limit(None) == objects.DEFAULT_PAGE


def test_a_failed_batch_says_what_its_invalid_campaign_says() -> None:
    from openai.types import Batch

    ready = {
        "type": "Ready",
        "status": "False",
        "reason": "ItemsInvalid",
        "message": "requests.jsonl line 4: custom_id 'a' is already the custom_id of line 1",
        "lastTransitionTime": "2026-03-01T10:00:00Z",
    }
    failed = Batch.model_validate(objects.batch_object(_batch(phase="Invalid", conditions=[ready])))
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data is not None
    (error,) = failed.errors.data
    assert (error.code, error.message) == ("ItemsInvalid", ready["message"])
    assert failed.output_file_id is None
