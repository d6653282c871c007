"""`kubectl campaign suspend|resume|retry|cancel NAME`: the recorded actions.

Actions never touch shard status (only the operator and workers write it). Each is a merge patch of
the Campaign that changes what the operator acts on: `spec.suspend`, `spec.retry` (`generation`, and
`shards`: the names a retry is limited to; unset means every Blocked and Failed shard), and the
annotation `shardops.dev/cancelled`: RFC 3339 time of `kubectl campaign cancel` (which also
suspends); plus an Event on the Campaign saying who asked. The patches, the retry selection and the
text are pure; the `run_*` functions do the reads and writes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardops.api.campaign import MAX_RETRY_SHARDS, Campaign
from shardops.api.common import JSON
from shardops.api.enums import ShardPhase
from shardops.api.names import CANCELLED_ANNOTATION, RESUMED_ANNOTATION, cancel_patch
from shardops.api.shard import Shard
from shardops.cli.campaign_client import EXIT_BAD_STATE, EXIT_NOT_FOUND, EXIT_OK, CliError, bad_state
from shardops.cli.command import Context, load, parse_campaign
from shardops.cli.text import names_text
from shardops.k8s.api import Conflict
from shardops.logic.timefmt import rfc3339
from shardops.state import error_threshold, ledger

# Rounds of read, decide and write with a resourceVersion precondition before a retry gives up.
CONFLICT_ROUNDS = 3

SUSPEND_REQUESTED = "SuspendRequested"
RESUME_REQUESTED = "ResumeRequested"
RETRY_REQUESTED = "RetryRequested"
CANCEL_REQUESTED = "CancelRequested"
DELETE_REQUESTED = "DeleteRequested"

GAVE_UP = (ShardPhase.BLOCKED, ShardPhase.FAILED)


def cancelled_at(campaign: Campaign) -> str | None:
    return (campaign.metadata.annotations or {}).get(CANCELLED_ANNOTATION)


class ActionRefused(CliError):
    """The action cannot be recorded as asked: a bad state (exit 1) or a shard that is not there (3)."""


# --- patches: what each action writes -----------------------------------------------------------------


def suspend_patch() -> JSON:
    return {"spec": {"suspend": True}}


def resume_patch(campaign: Campaign, now: dt.datetime) -> JSON:
    """spec.suspend=false; a cancellation is withdrawn with it, and a hold of the error threshold
    lifted (the resume's time in the shardops.dev/resumed annotation)."""
    patch: JSON = {"spec": {"suspend": False}}
    annotations: JSON = {}
    if CANCELLED_ANNOTATION in (campaign.metadata.annotations or {}):
        annotations[CANCELLED_ANNOTATION] = None
    if error_threshold.held(campaign):
        annotations[RESUMED_ANNOTATION] = rfc3339(now)
    if annotations:
        patch["metadata"] = {"annotations": annotations}
    return patch


@dataclass(frozen=True)
class RetrySelection:
    """`shards` to send back to Pending; `everything` when the request is every Blocked and Failed
    shard (no --shard; --blocked and --failed both or neither): spec.retry.shards is left unset."""

    shards: tuple[str, ...]
    everything: bool


def _refuse_while_waiting(campaign: Campaign) -> None:
    if campaign.retry_requested:
        raise ActionRefused(
            EXIT_BAD_STATE,
            f"retry generation {campaign.spec.retry.generation} is still waiting for the operator "
            f"(status.lastRetryGeneration is {campaign.current_status.last_retry_generation}); "
            "wait until it acted (kubectl campaign status) before asking again",
        )


def select_retry(
    campaign: Campaign, shards: Sequence[Shard], *, blocked: bool, failed: bool, names: Sequence[str]
) -> RetrySelection:
    """Which shards a retry covers: --blocked and/or --failed (neither: both), narrowed to --shard names."""
    _refuse_while_waiting(campaign)
    phases = {p for p, wanted in ((ShardPhase.BLOCKED, blocked), (ShardPhase.FAILED, failed)) if wanted}
    if not phases:
        phases = set(GAVE_UP)
    by_name = {s.name: s for s in shards}
    for name in names:
        shard = by_name.get(name)
        if shard is None:
            raise ActionRefused(EXIT_NOT_FOUND, f'shard "{name}" is not a shard of campaign {campaign.name}')
        if shard.phase not in phases:
            wanted_text = " or ".join(sorted(str(p) for p in phases))
            raise ActionRefused(
                EXIT_BAD_STATE,
                f"shard {name} is {shard.phase or ShardPhase.QUEUED}, not {wanted_text}: "
                "nothing to retry there",
            )
    chosen = sorted(set(names)) if names else sorted(s.name for s in shards if s.phase in phases)
    everything = not names and phases == set(GAVE_UP)
    # Gave-up shards folded into the ledger are gone from the API: a request for all of them makes
    # the operator cut them again from the ledger (scheduler/retry.py); --failed or --blocked alone
    # names live shards only.
    if not chosen and not (everything and campaign.current_status.folded.gave_up):
        which = " or ".join(sorted(str(p) for p in phases))
        raise ActionRefused(
            EXIT_BAD_STATE, f"nothing to retry: campaign {campaign.name} has no {which} shard"
        )
    # Named shards stay a list even when they are all that gave up: a shard that gives up after this
    # read is not the user's to retry by name.
    return RetrySelection(tuple(chosen), everything=everything)


def retry_patch(campaign: Campaign, selection: RetrySelection) -> JSON:
    """Bump spec.retry.generation and set spec.retry.shards in the same merge patch: the names when the
    request is not all of them, else null (drops the previous request's list). Sent with the campaign's
    resourceVersion, so two requests cannot merge silently."""
    if not selection.everything and len(selection.shards) > MAX_RETRY_SHARDS:
        raise ActionRefused(
            EXIT_BAD_STATE,
            f"{len(selection.shards)} shards named, a retry request holds at most {MAX_RETRY_SHARDS}: "
            "retry them all (no --shard), or in smaller groups one after the other",
        )
    shards = None if selection.everything else list(selection.shards)
    retry: JSON = {"generation": campaign.spec.retry.generation + 1, "shards": shards}
    if campaign.spec.retry.errored:
        retry["errored"] = None  # the previous request was for the errored items: this one is not
    return {"spec": {"retry": retry}}


def errored_retry_patch(campaign: Campaign, shards: Sequence[Shard]) -> tuple[JSON, int]:
    """`retry --errored`: the patch asking the operator to run again the errored items of the Done
    shards (spec.retry.errored with the next generation, no shard list), and how many items errored;
    refused while an earlier request waits, or when no item errored."""
    _refuse_while_waiting(campaign)
    folded = campaign.current_status.folded
    errored = ledger.campaign_errored_items(folded, ledger.unfolded(shards, folded))
    if not errored:
        raise ActionRefused(EXIT_BAD_STATE, f"nothing to retry: campaign {campaign.name} has no errored item")
    retry: JSON = {"generation": campaign.spec.retry.generation + 1, "shards": None, "errored": True}
    return {"spec": {"retry": retry}}, errored


# --- the outcome and its text -------------------------------------------------------------------------


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


def render_action(result: ActionResult) -> str:
    lines = [f"campaign {result.namespace}/{result.name}: {result.message}"]
    if result.changed and result.event:
        lines.append(f"recorded as Event {result.event}" + (f" (by {result.user})" if result.user else ""))
    lines.extend(f"warning: {w}" for w in result.warnings)
    return "\n".join(lines)


# --- commands -----------------------------------------------------------------------------------------


def _record(
    ctx: Context,
    action: str,
    body: JSON,
    *,
    reason: str,
    note: str,
    message: str,
    patch: JSON | None,
) -> ActionResult:
    user = ctx.client.who_am_i()
    event = ctx.client.record_event(
        body, reason=reason, note=f"{note} (by {user}, kubectl campaign {action})", user=user, now=ctx.clock()
    )
    warnings: tuple[str, ...] = ()
    if event is None:
        warnings = (
            f"the request is recorded in the Campaign, but its Event ({reason}) could not be created",
        )
    metadata = body.get("metadata") or {}
    return ActionResult(
        action=action,
        namespace=str(metadata.get("namespace")),
        name=str(metadata.get("name")),
        changed=True,
        message=message,
        patch=patch,
        event=event,
        user=user,
        warnings=warnings,
    )


def _unchanged(action: str, campaign: Campaign, message: str) -> ActionResult:
    return ActionResult(action, campaign.namespace, campaign.name, changed=False, message=message)


def _finish(ctx: Context, result: ActionResult) -> int:
    ctx.show(result, render_action)
    for warning in result.warnings if ctx.output != "human" else ():
        ctx.err(f"warning: {warning}")
    return EXIT_OK


def run_suspend(ctx: Context) -> int:
    body = ctx.client.get_campaign(ctx.namespace, ctx.args.name)
    campaign = parse_campaign(body)
    if campaign.spec.suspend:
        return _finish(
            ctx, _unchanged("suspend", campaign, "already suspended (spec.suspend is true); nothing changed")
        )
    patch = suspend_patch()
    patched = ctx.client.patch_campaign(campaign.namespace, campaign.name, patch)
    return _finish(
        ctx,
        _record(
            ctx,
            "suspend",
            patched,
            reason=SUSPEND_REQUESTED,
            note="spec.suspend=true: no new claims or workers; running shards finish",
            message="suspend requested (spec.suspend=true): no new claims; running shards finish",
            patch=patch,
        ),
    )


def run_resume(ctx: Context) -> int:
    body = ctx.client.get_campaign(ctx.namespace, ctx.args.name)
    campaign = parse_campaign(body)
    cancelled = cancelled_at(campaign)
    held = error_threshold.held(campaign)
    if not campaign.spec.suspend and cancelled is None and not held:
        return _finish(
            ctx, _unchanged("resume", campaign, "not suspended (spec.suspend is false); nothing changed")
        )
    patch = resume_patch(campaign, ctx.clock())
    patched = ctx.client.patch_campaign(campaign.namespace, campaign.name, patch)
    withdrawn = f"; the cancellation of {cancelled} is withdrawn" if cancelled else ""
    if held:
        withdrawn += "; the error threshold's hold is lifted (only attempts from now on count)"
    return _finish(
        ctx,
        _record(
            ctx,
            "resume",
            patched,
            reason=RESUME_REQUESTED,
            note=f"spec.suspend=false: claiming resumes{withdrawn}",
            message=f"resume requested (spec.suspend=false){withdrawn}",
            patch=patch,
        ),
    )


def run_retry(ctx: Context) -> int:
    args = ctx.args
    if args.errored:
        return _run_errored_retry(ctx)

    def decide(campaign: Campaign, shards: Sequence[Shard], generation: int) -> tuple[JSON, str, str]:
        selection = select_retry(campaign, shards, blocked=args.blocked, failed=args.failed, names=args.shard)
        scope = "every Blocked and Failed shard" if selection.everything else "only these shards"
        names = names_text(list(selection.shards), limit=20)
        count = len(selection.shards)
        return (
            retry_patch(campaign, selection),
            f"spec.retry.generation={generation}: {count} shard(s) to retry ({scope}): {names}",
            f"retry requested (spec.retry.generation={generation}): {count} shard(s), {scope}: "
            f"{names}; the operator sends them back to Pending with attempts reset",
        )

    return _request_retry(ctx, decide)


def _run_errored_retry(ctx: Context) -> int:
    args = ctx.args
    if args.blocked or args.failed or args.shard:
        raise bad_state(
            "--errored reruns the errored items of all Done shards; it takes no --blocked, --failed, --shard"
        )

    def decide(campaign: Campaign, shards: Sequence[Shard], generation: int) -> tuple[JSON, str, str]:
        patch, errored = errored_retry_patch(campaign, shards)
        return (
            patch,
            f"spec.retry.generation={generation}: {errored} errored item(s) to run again",
            f"retry requested (spec.retry.generation={generation}): the {errored} errored item(s) "
            "run again, same keys; the other items keep their results",
        )

    return _request_retry(ctx, decide)


def _request_retry(
    ctx: Context, decide: Callable[[Campaign, Sequence[Shard], int], tuple[JSON, str, str]]
) -> int:
    """Record a retry request: read the campaign, `decide` its patch, note and message for the next
    retry generation, and write it at the version read; on a conflict read and decide again."""
    for _ in range(CONFLICT_ROUNDS):
        _, campaign, _, shards = load(ctx, ctx.args.name)
        patch, note, message = decide(campaign, shards, campaign.spec.retry.generation + 1)
        try:
            patched = ctx.client.patch_campaign(
                campaign.namespace, campaign.name, patch, resource_version=campaign.metadata.resource_version
            )
        except Conflict:
            continue  # changed since we read it: read again and decide again
        return _finish(
            ctx,
            _record(ctx, "retry", patched, reason=RETRY_REQUESTED, note=note, message=message, patch=patch),
        )
    raise bad_state(f"campaign {ctx.args.name} kept changing while recording the retry; try again")


def run_cancel(ctx: Context) -> int:
    body = ctx.client.get_campaign(ctx.namespace, ctx.args.name)
    campaign = parse_campaign(body)
    if ctx.args.delete:
        user = ctx.client.who_am_i()
        event = ctx.client.record_event(
            body,
            reason=DELETE_REQUESTED,
            note=f"campaign deleted by {user} (kubectl campaign cancel --delete)",
            user=user,
            now=ctx.clock(),
        )
        ctx.client.delete_campaign(campaign.namespace, campaign.name)
        result = ActionResult(
            "cancel",
            campaign.namespace,
            campaign.name,
            changed=True,
            message="deleted: its shards and worker Jobs are garbage-collected; stored results stay",
            event=event,
            user=user,
        )
        return _finish(ctx, result)
    already = cancelled_at(campaign)
    if already is not None and campaign.spec.suspend:
        return _finish(
            ctx, _unchanged("cancel", campaign, f"already cancelled at {already}; nothing changed")
        )
    now = ctx.clock()
    patch = cancel_patch(rfc3339(now))
    patched = ctx.client.patch_campaign(campaign.namespace, campaign.name, patch)
    return _finish(
        ctx,
        _record(
            ctx,
            "cancel",
            patched,
            reason=CANCEL_REQUESTED,
            note="cancelled: spec.suspend=true and annotation shardops.dev/cancelled set",
            message=(
                "cancelled: suspended (spec.suspend=true) and marked shardops.dev/cancelled; "
                "running shards finish"
            ),
            patch=patch,
        ),
    )
