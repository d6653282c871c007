"""Pure: the recorded actions of `kubectl campaign` as patches of the Campaign.

Actions never touch shard status (only the operator and workers write it). They change what the
operator acts on: `spec.suspend`, `spec.retry` (`generation`, and `shards`: the names a retry is
limited to; unset means every Blocked and Failed shard), and the annotation
`shardops.dev/cancelled`: RFC 3339 time of `kubectl campaign cancel` (which also suspends).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardops.api.campaign import MAX_RETRY_SHARDS, Campaign
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.cli.campaign_views import CANCELLED_ANNOTATION
from shardops.logic.timefmt import rfc3339

JSON = dict[str, Any]

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
    """`shards` to send back to Pending; `everything` when the request is every Blocked and Failed
    shard (no --shard; --blocked and --failed both or neither): spec.retry.shards is left unset."""

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
    chosen = sorted(set(names)) if names else sorted(s.name for s in shards if s.phase in phases)
    if not chosen:
        which = " or ".join(sorted(str(p) for p in phases))
        raise ActionRefused(1, f"nothing to retry: campaign {campaign.name} has no {which} shard")
    # Named shards stay a list even when they are all that gave up: a shard that gives up after this
    # read is not the user's to retry by name.
    return RetrySelection(tuple(chosen), everything=not names and phases == set(GAVE_UP))


def retry_patch(campaign: Campaign, selection: RetrySelection) -> JSON:
    """Bump spec.retry.generation and set spec.retry.shards in the same merge patch: the names when the
    request is not all of them, else null (drops the previous request's list). Sent with the campaign's
    resourceVersion, so two requests cannot merge silently."""
    if not selection.everything and len(selection.shards) > MAX_RETRY_SHARDS:
        raise ActionRefused(
            1,
            f"{len(selection.shards)} shards named, a retry request holds at most {MAX_RETRY_SHARDS}: "
            "retry them all (no --shard), or in smaller groups one after the other",
        )
    shards = None if selection.everything else list(selection.shards)
    return {"spec": {"retry": {"generation": campaign.spec.retry.generation + 1, "shards": shards}}}


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
