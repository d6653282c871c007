"""Pure: the recorded actions of `kubectl campaign` as patches of the Campaign.

Actions never touch shard status (only the operator and workers write it). They change what the
operator acts on: `spec.suspend`, `spec.retry.generation`, and two annotations:

* `shardops.dev/retry-shards`: `{"generation": N, "shards": [...]}` limits the retry request of
  `spec.retry.generation == N` to those shards. Absent, or naming another generation, the request
  covers every Blocked and Failed shard (what `spec.retry.generation` alone means).
* `shardops.dev/cancelled`: RFC 3339 time of `kubectl campaign cancel` (which also suspends).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardops.api.campaign import Campaign
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.cli.campaign_views import CANCELLED_ANNOTATION
from shardops.logic.timefmt import rfc3339

JSON = dict[str, Any]

RETRY_SHARDS_ANNOTATION = "shardops.dev/retry-shards"
# Annotations (all of them together) are capped at 256 KiB by the API server.
RETRY_SHARDS_MAX_BYTES = 200 * 1024

SUSPEND_REQUESTED = "SuspendRequested"
RESUME_REQUESTED = "ResumeRequested"
RETRY_REQUESTED = "RetryRequested"
CANCEL_REQUESTED = "CancelRequested"
DELETE_REQUESTED = "DeleteRequested"

GAVE_UP = (ShardPhase.BLOCKED, ShardPhase.FAILED)


class ActionRefused(Exception):
    """The action cannot be recorded as asked; `exit_code` says why (1 bad state, 3 not found)."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message


def suspend_patch() -> JSON:
    return {"spec": {"suspend": True}}


def resume_patch(campaign: Campaign) -> JSON:
    """spec.suspend=false; a cancellation is withdrawn with it."""
    patch: JSON = {"spec": {"suspend": False}}
    if CANCELLED_ANNOTATION in (campaign.metadata.annotations or {}):
        patch["metadata"] = {"annotations": {CANCELLED_ANNOTATION: None}}
    return patch


def cancel_patch(now: dt.datetime) -> JSON:
    return {"spec": {"suspend": True}, "metadata": {"annotations": {CANCELLED_ANNOTATION: rfc3339(now)}}}


@dataclass(frozen=True)
class RetrySelection:
    """`shards` to send back to Pending; `everything` when they are all the Blocked and Failed shards,
    which `spec.retry.generation` alone already means."""

    shards: tuple[str, ...]
    everything: bool


def select_retry(
    campaign: Campaign, shards: Sequence[Shard], *, blocked: bool, failed: bool, names: Sequence[str]
) -> RetrySelection:
    """Which shards a retry covers: --blocked and/or --failed (neither: both), narrowed to --shard names."""
    if campaign.retry_requested:
        raise ActionRefused(
            1,
            f"retry generation {campaign.spec.retry.generation} is still waiting for the operator "
            f"(status.lastRetryGeneration is {campaign.current_status.last_retry_generation}); "
            "wait until it acted (kubectl campaign status) before asking again",
        )
    phases = {p for p, wanted in ((ShardPhase.BLOCKED, blocked), (ShardPhase.FAILED, failed)) if wanted}
    if not phases:
        phases = set(GAVE_UP)
    by_name = {s.name: s for s in shards}
    for name in names:
        shard = by_name.get(name)
        if shard is None:
            raise ActionRefused(3, f'shard "{name}" is not a shard of campaign {campaign.name}')
        if shard.phase not in phases:
            wanted_text = " or ".join(sorted(str(p) for p in phases))
            raise ActionRefused(
                1,
                f"shard {name} is {shard.phase or ShardPhase.QUEUED}, not {wanted_text}: "
                "nothing to retry there",
            )
    gave_up = sorted(s.name for s in shards if s.phase in GAVE_UP)
    chosen = sorted(set(names)) if names else [s.name for s in shards if s.phase in phases]
    chosen = sorted(chosen)
    if not chosen:
        which = " or ".join(sorted(str(p) for p in phases))
        raise ActionRefused(1, f"nothing to retry: campaign {campaign.name} has no {which} shard")
    return RetrySelection(tuple(chosen), everything=chosen == gave_up)


def retry_patch(campaign: Campaign, selection: RetrySelection) -> JSON:
    """Bump spec.retry.generation; name the shards when the request is not all of them (else drop a
    stale list). Sent with the campaign's resourceVersion, so two requests cannot merge silently."""
    generation = campaign.spec.retry.generation + 1
    value: str | None = None
    if not selection.everything:
        value = json.dumps(
            {"generation": generation, "shards": list(selection.shards)}, separators=(",", ":")
        )
        if len(value.encode()) > RETRY_SHARDS_MAX_BYTES:
            raise ActionRefused(
                1,
                f"{len(selection.shards)} shard names do not fit in an annotation: retry them all "
                "(no --shard), or in smaller groups one after the other",
            )
    patch: JSON = {"spec": {"retry": {"generation": generation}}}
    annotations = campaign.metadata.annotations or {}
    if value is not None or RETRY_SHARDS_ANNOTATION in annotations:
        patch["metadata"] = {"annotations": {RETRY_SHARDS_ANNOTATION: value}}
    return patch


def retry_shards(annotations: Mapping[str, str] | None, generation: int) -> frozenset[str] | None:
    """The shards the retry request of `generation` is limited to, or None: every Blocked and Failed
    shard. For the operator (it acts on spec.retry.generation): an annotation for another generation,
    or one that does not parse, limits nothing."""
    raw = (annotations or {}).get(RETRY_SHARDS_ANNOTATION)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("generation") != generation:
        return None
    shards = value.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, str) for s in shards):
        return None
    return frozenset(shards)


@dataclass(frozen=True)
class ActionResult:
    """What an action did: `changed` False when the campaign already was as asked (nothing written)."""

    action: str
    namespace: str
    name: str
    changed: bool
    message: str
    patch: JSON | None = None
    event: str | None = None
    user: str | None = None
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> JSON:
        return {
            "action": self.action,
            "namespace": self.namespace,
            "name": self.name,
            "changed": self.changed,
            "message": self.message,
            "patch": self.patch,
            "event": self.event,
            "user": self.user,
            "warnings": list(self.warnings),
        }
