"""OpenAI's Batch API objects as shardops serves them, from Campaigns and stored files. Pure: every
value comes in as an argument.

A batch is a Campaign (its name is the batch id) labelled `shardops.dev/batch-api`, whose
annotations keep what the request said that a Campaign has no field for (endpoint, completion window,
input file, metadata). An input file is an object in the namespace's S3 area named by its content's
sha256 (`file-<sha256>`), so an id never reaches another namespace's object; a batch's output and
error files are `<batch id>-output` and `<batch id>-errors`, streamed from its result store.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardops import API_GROUP
from shardops.api.campaign import Campaign
from shardops.api.common import JSON, find_condition
from shardops.api.enums import FINISHED_PHASES, CampaignPhase, ConditionType, LlmRequestFormat
from shardops.api.names import CANCELLED_ANNOTATION
from shardops.api.openai_batch import BATCH_ENDPOINTS

BATCH_LABEL = f"{API_GROUP}/batch-api"
ENDPOINT_ANNOTATION = f"{API_GROUP}/batch-endpoint"
WINDOW_ANNOTATION = f"{API_GROUP}/batch-completion-window"
INPUT_FILE_ANNOTATION = f"{API_GROUP}/batch-input-file"
METADATA_ANNOTATION = f"{API_GROUP}/batch-metadata"

# OpenAI's only window; shardops keeps no deadline of its own for it (a batch runs until done).
COMPLETION_WINDOWS = ("24h",)
FILE_PURPOSE = "batch"
# The "campaign" part of the S3 key of uploaded files: content-addressed under the namespace's area.
FILES_AREA = "batch-api-files"
OUTPUT_SUFFIX = "-output"
ERROR_SUFFIX = "-errors"
DEFAULT_PAGE = 20
MAX_PAGE = 100
METADATA_MAX_KEYS = 16  # as OpenAI: at most 16 pairs, keys up to 64 and values up to 512 characters
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class ApiProblem(Exception):
    """An answer in OpenAI's error shape: HTTP `status`, `{"error": {message, type, param, code}}`."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> JSON:
        return error_body(self.message, self.kind, self.param)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> JSON:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def not_found(what: str, ident: str) -> ApiProblem:
    """404 for anything not in the caller's namespace, there or not: never say it exists elsewhere."""
    return ApiProblem(404, f"No {what} found with id '{ident}'.", "invalid_request_error", "id")


def unauthorized(why: str) -> ApiProblem:
    return ApiProblem(401, why, "invalid_authentication")


# --- files -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRef:
    """What a file id names: an uploaded input (`digest`), or a batch's output or error file."""

    kind: str  # "input", "output" or "errors"
    digest: str | None = None
    batch: str | None = None


def input_file_id(digest: str) -> str:
    return f"file-{digest}"


def output_file_id(batch: str) -> str:
    return f"{batch}{OUTPUT_SUFFIX}"


def error_file_id(batch: str) -> str:
    return f"{batch}{ERROR_SUFFIX}"


def parse_file_id(file_id: str) -> FileRef:
    """The file an id names; 404 for an id this service never gives out."""
    if file_id.startswith("file-") and _DIGEST.match(file_id[len("file-") :]):
        return FileRef("input", digest=file_id[len("file-") :])
    for suffix, kind in ((OUTPUT_SUFFIX, "output"), (ERROR_SUFFIX, "errors")):
        if file_id.endswith(suffix) and file_id.startswith("batch-"):
            return FileRef(kind, batch=file_id[: -len(suffix)])
    raise not_found("file", file_id)


def input_key(area_prefix: str, digest: str) -> str:
    """The S3 key of an uploaded file in the namespace's area (`area_prefix`: S3Store.input_prefix)."""
    return f"{area_prefix}{digest}.jsonl"


def file_object(
    file_id: str, size: int | None, created_at: int, filename: str, purpose: str = FILE_PURPOSE
) -> JSON:
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": created_at,
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
    }


# --- batches ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchRequest:
    """A `POST /v1/batches` body, checked."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Mapping[str, str]

    @classmethod
    def parse(cls, body: Any) -> BatchRequest:
        if not isinstance(body, Mapping):
            raise ApiProblem(400, "The request body must be a JSON object.")
        file_id = body.get("input_file_id")
        if not isinstance(file_id, str) or parse_file_id_or_none(file_id) is None:
            raise ApiProblem(
                400, f"input_file_id {file_id!r} is not a file of this service.", param="input_file_id"
            )
        endpoint = body.get("endpoint")
        if endpoint not in BATCH_ENDPOINTS:
            raise ApiProblem(
                400,
                f"endpoint must be one of {', '.join(BATCH_ENDPOINTS)}, got {endpoint!r}.",
                param="endpoint",
            )
        window = body.get("completion_window")
        if window not in COMPLETION_WINDOWS:
            raise ApiProblem(
                400, f"completion_window must be {', '.join(COMPLETION_WINDOWS)}.", param="completion_window"
            )
        metadata = body.get("metadata") or {}
        if (
            not isinstance(metadata, Mapping)
            or len(metadata) > METADATA_MAX_KEYS
            or any(not isinstance(k, str) or len(k) > 64 for k in metadata)
            or any(not isinstance(v, str) or len(v) > 512 for v in metadata.values())
        ):
            raise ApiProblem(
                400,
                f"metadata is at most {METADATA_MAX_KEYS} string pairs (keys up to 64, values up to "
                "512 characters).",
                param="metadata",
            )
        return cls(file_id, str(endpoint), str(window), dict(metadata))


def parse_file_id_or_none(file_id: str) -> FileRef | None:
    try:
        ref = parse_file_id(file_id)
    except ApiProblem:
        return None
    return ref if ref.kind == "input" else None


@dataclass(frozen=True)
class BatchDefaults:
    """What the installation decides for every batch's Campaign (the chart's batchAPI values)."""

    source_kind: str
    source_name: str
    worker_image: str
    shard_size: int
    max_concurrency: int


# The built-in worker needs a baseUrl and a model; the Source named by sourceRef overrides both.
SOURCE_NAME_IN_CAMPAIGN = "batch"
_PLACEHOLDER_BASE_URL = "http://from-source-ref.invalid/v1"
_PLACEHOLDER_MODEL = "from-source-ref"


def batch_campaign(
    name: str, namespace: str, request: BatchRequest, items_key: str, bucket: str, defaults: BatchDefaults
) -> JSON:
    """The Campaign a batch is: its items the uploaded file, each line sent as written through the
    installation's Source (the model mapping is that Source's)."""
    return {
        "apiVersion": f"{API_GROUP}/v1alpha1",
        "kind": "Campaign",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {BATCH_LABEL: "true"},
            "annotations": {
                ENDPOINT_ANNOTATION: request.endpoint,
                WINDOW_ANNOTATION: request.completion_window,
                INPUT_FILE_ANNOTATION: request.input_file_id,
                METADATA_ANNOTATION: json.dumps(dict(request.metadata), sort_keys=True),
            },
        },
        "spec": {
            "shardSize": defaults.shard_size,
            "maxConcurrency": defaults.max_concurrency,
            "itemsFrom": {"object": {"key": items_key, "bucket": bucket}},
            "sources": [
                {
                    "name": SOURCE_NAME_IN_CAMPAIGN,
                    "sourceRef": {"kind": defaults.source_kind, "name": defaults.source_name},
                }
            ],
            "defaultSource": SOURCE_NAME_IN_CAMPAIGN,
            "worker": {
                "image": defaults.worker_image,
                "command": ["shardops", "llm"],
                "llm": {
                    "format": str(LlmRequestFormat.OPENAI_BATCH),
                    "baseUrl": _PLACEHOLDER_BASE_URL,
                    "model": _PLACEHOLDER_MODEL,
                },
            },
        },
    }


def is_batch(campaign: Campaign) -> bool:
    return (campaign.metadata.labels or {}).get(BATCH_LABEL) == "true"


def _epoch(moment: dt.datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def _epoch_of_text(text: str | None) -> int | None:
    return int(dt.datetime.fromisoformat(text).timestamp()) if text else None


def batch_status(campaign: Campaign) -> str:
    """OpenAI's status for the campaign's phase: validating until its items were read; cancelling
    while a cancelled campaign's shards may still run, cancelled after; finalizing; completed (also
    when some shards gave up: their items count as failed); failed for an Invalid campaign.

    Cancelled only once a status computed from the suspended spec (observedGeneration) counts no
    shard Running and none Pending: a status written before the operator saw the cancel counts
    shards as they were then (a worker may have claimed one since), and a Pending shard is
    claimable until that pass pauses it. From such a status on, nothing of the batch can run."""
    status = campaign.current_status
    phase = status.phase
    if phase is CampaignPhase.INVALID:
        return "failed"
    if phase in FINISHED_PHASES:
        return "completed"
    if CANCELLED_ANNOTATION in (campaign.metadata.annotations or {}):
        may_run = status.counts.running or status.counts.pending
        return "cancelled" if campaign.spec_observed and not may_run else "cancelling"
    if phase is CampaignPhase.FINALIZING:
        return "finalizing"
    if status.items_total is None:
        return "validating"
    return "in_progress"


def request_counts(campaign: Campaign) -> JSON:
    """{total, completed, failed}: failed are the errored items (status.itemsErrored) plus those of
    shards that gave up (Failed, Blocked); completed those of Done shards less the errored. The
    status counts shards, not items: a Done shard counts as full, so while shards gave up or run the
    figures may be off by the short last shard (less than one shard); with every shard Done they
    are exact."""
    status = campaign.current_status
    total = status.items_total or 0
    errored = status.items_errored or 0
    done_items = min(total, status.counts.done * campaign.spec.shard_size)
    if status.phase in FINISHED_PHASES:
        gave_up = total - done_items
    else:
        gave_up = min(
            total - done_items, (status.counts.failed + status.counts.blocked) * campaign.spec.shard_size
        )
    return {"total": total, "completed": max(0, done_items - errored), "failed": errored + gave_up}


def batch_object(campaign: Campaign) -> JSON:
    annotations = campaign.metadata.annotations or {}
    state = batch_status(campaign)
    name = campaign.name
    finished = state in ("completed", "failed", "cancelled")
    errors = None
    if state == "failed":
        # An Invalid campaign's Ready=False condition names what is wrong (an input line, a Source).
        ready = find_condition(list(campaign.current_status.conditions or []), ConditionType.READY)
        problem = {
            "code": str(ready.reason) if ready and ready.reason else "invalid",
            "message": ready.message if ready and ready.message else "the batch's Campaign is Invalid",
            "param": None,
            "line": None,
        }
        errors = {"object": "list", "data": [problem]}
    counts = request_counts(campaign)
    return {
        "id": name,
        "object": "batch",
        "endpoint": annotations.get(ENDPOINT_ANNOTATION, ""),
        "errors": errors,
        "input_file_id": annotations.get(INPUT_FILE_ANNOTATION, ""),
        "completion_window": annotations.get(WINDOW_ANNOTATION, COMPLETION_WINDOWS[0]),
        "status": state,
        "output_file_id": output_file_id(name) if finished and state != "failed" else None,
        "error_file_id": error_file_id(name) if finished and state != "failed" else None,
        "created_at": _epoch(campaign.metadata.creation_timestamp) or 0,
        "in_progress_at": None,
        "expires_at": None,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": _epoch_of_text(annotations.get(CANCELLED_ANNOTATION)),
        "cancelled_at": None,
        "request_counts": counts,
        "metadata": json.loads(annotations.get(METADATA_ANNOTATION) or "{}"),
    }


# --- pagination ------------------------------------------------------------------------------------


def page_limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_PAGE
    try:
        limit = int(text)
    except ValueError:
        raise ApiProblem(400, f"limit must be an integer from 1 to {MAX_PAGE}.", param="limit") from None
    if not 1 <= limit <= MAX_PAGE:
        raise ApiProblem(400, f"limit must be an integer from 1 to {MAX_PAGE}.", param="limit")
    return limit


def newest_first(campaigns: Sequence[Campaign]) -> list[Campaign]:
    """OpenAI lists batches newest first; the name breaks ties (creation times are whole seconds)."""
    return sorted(
        campaigns,
        key=lambda c: (-(_epoch(c.metadata.creation_timestamp) or 0), c.name),
    )


def batch_page(campaigns: Sequence[Campaign], after: str | None, limit: int) -> JSON:
    """One page of `GET /v1/batches`: the batches after the one named `after` (newest first)."""
    ordered = newest_first([c for c in campaigns if is_batch(c)])
    start = 0
    if after is not None:
        position = next((i for i, c in enumerate(ordered) if c.name == after), None)
        if position is None:
            raise not_found("batch", after)
        start = position + 1
    chosen = ordered[start : start + limit]
    data = [batch_object(c) for c in chosen]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }
