"""Shard state changes on the API server: one transition = one status patch with a resourceVersion
precondition + one Event whose name the history records. The operator and the worker both go
through `apply_transition`, so the rules of `logic.transitions` hold whoever acts."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from shardops.api.common import JSON
from shardops.api.enums import ShardPhase
from shardops.api.names import CAMPAIGN_LABEL, SHARD_PHASE_FIELD
from shardops.api.shard import HistoryEntry, Shard, ShardStatus
from shardops.k8s import events
from shardops.k8s.ambiguous import write_recognised
from shardops.k8s.api import SHARDS, KubeClient
from shardops.logic.transitions import (
    Action,
    event_reason,
    next_attempt,
    records_event,
    transition,
)


@dataclass(frozen=True)
class Actor:
    """Who acts: the reporting controller and instance of Events, and the status field manager."""

    controller: str
    instance: str


@dataclass(frozen=True)
class TransitionRequest:
    action: Action
    message: str
    # ShardStatus fields (snake_case) to set along with the phase, e.g. owner, lease_until, last_error.
    updates: dict[str, Any] = field(default_factory=dict)
    # Override of the attempt the shard ends up with (the claim sets it explicitly).
    attempt: int | None = None


# Transitions that end an attempt with an error; their history entry carries its class and source.
_FAILURES = frozenset({Action.FAIL_RETRYABLE, Action.FAIL_FINAL, Action.BLOCK, Action.RECLAIM, Action.REVOKE})


def planned_status(
    shard: Shard, request: TransitionRequest, now: dt.datetime, event_name: str | None
) -> ShardStatus:
    """The status after the transition, or IllegalTransition: pure, so it is unit-tested without a cluster."""
    current = shard.current_status
    phase = current.phase or ShardPhase.QUEUED
    target = transition(phase, request.action)
    attempt = (
        request.attempt
        if request.attempt is not None
        else next_attempt(max(current.attempt, 1), request.action)
    )
    updates = dict(request.updates)
    if "last_error" in updates and updates["last_error"] is not None and event_name:
        updates["last_error"] = updates["last_error"].model_copy(update={"event": event_name})
    status = current.model_copy(update={**updates, "phase": target, "attempt": attempt})
    error = updates.get("last_error") if request.action in _FAILURES else None
    entry = HistoryEntry(
        phase=target,
        at=now,
        reason=event_reason(request.action),
        attempt=attempt if request.action is Action.CLAIM else max(current.attempt, 1),
        owner=status.owner if target is ShardPhase.RUNNING else current.owner,
        event=event_name,
        source=(error.source if error is not None and error.source else None) or status.source,
        error_class=error.error_class if error is not None else None,
    )
    return ShardStatus.model_validate(status.with_history(entry).model_dump())


def apply_transition(
    kube: KubeClient,
    shard: Shard,
    request: TransitionRequest,
    actor: Actor,
    now: dt.datetime,
) -> Shard:
    """Write the transition if the shard is still at the version we read (else Conflict) and record it
    in its history. A write whose answer was lost is recognised on a re-read (`shows_transition`)
    and counts as written.
    """
    # The campaign's Event for the reason, which the operator's pass raises by this transition's
    # count (`events.EventSeries`): named here, posted there, so no write per shard.
    loud = records_event(request.action)
    event_name = events.series_name(shard.spec.campaign, str(event_reason(request.action))) if loud else None
    status = planned_status(shard, request, now, event_name)

    def reread() -> JSON | None:
        current = kube.get(SHARDS, shard.namespace, shard.name)
        return current if shows_transition(Shard.parse(current), status) else None

    patched = write_recognised(
        lambda: kube.patch(
            SHARDS,
            shard.namespace,
            shard.name,
            {"status": status.to_merge_patch()},
            resource_version=shard.metadata.resource_version,
            subresource="status",
        ),
        reread,
        f"{request.action} of shard {shard.name}",
    )
    return Shard.parse(patched)


def shows_transition(shard: Shard, planned: ShardStatus) -> bool:
    """The shard shows the transition that would have made `planned`: in the phase it entered, with
    the owner and fencing token it set, and the history entry it added (owner, reason, attempt and
    time to the microsecond: no other write adds that entry)."""
    status = shard.current_status
    claim = (status.phase, status.owner, status.fencing_token)
    if claim != (planned.phase, planned.owner, planned.fencing_token):
        return False
    added = planned.history[-1].to_dict()
    return any(entry.to_dict() == added for entry in status.history)


def list_shards(kube: KubeClient, namespace: str, campaign: str) -> list[Shard]:
    """Every Shard of the campaign, Done ones included."""
    return [
        Shard.parse(item)
        for item in kube.list(SHARDS, namespace, label_selector=f"{CAMPAIGN_LABEL}={campaign}")
    ]


# Done is the only phase whose count grows with the campaign: the others are bounded by the backlog
# (Pending), maxConcurrency (Running) or need a person (Failed, Blocked, Paused).
_UNFINISHED = f"{SHARD_PHASE_FIELD.removeprefix('.')}!={ShardPhase.DONE}"


def unfinished_query(campaign: str) -> dict[str, str]:
    """The selectors of a campaign's Shards that are not Done: bounded by the window, not by the
    campaign's size. A list with them, or a watch (a shard that turns Done leaves it as DELETED)."""
    return {"labelSelector": f"{CAMPAIGN_LABEL}={campaign}", "fieldSelector": _UNFINISHED}


# A Shard without a status is one the operator has created and not yet made Pending (a moment, in
# the same pass; or one an operator killed between the two writes left Queued until the next pass).
# The API server compares a missing field as the empty string.
_WITH_STATUS = f"{SHARD_PHASE_FIELD.removeprefix('.')}!="


def watched_query(campaign: str) -> dict[str, str]:
    """`unfinished_query` less the Shards that have no status yet: what a worker's watch follows.
    Such a shard is not claimable, and the write that makes it Pending brings it into the watch
    (as ADDED), so every worker is sent one event fewer per shard (each event of a watched shard
    goes to every worker of the campaign). A fresh read (`list_unfinished`) still sees them."""
    query = unfinished_query(campaign)
    return {**query, "fieldSelector": f"{query['fieldSelector']},{_WITH_STATUS}"}


def list_unfinished(kube: KubeClient, namespace: str, campaign: str) -> list[Shard]:
    """The campaign's Shards that are not Done (`unfinished_query`).

    Parsed lean (`Shard.parse_items_counted`): a look for work plans over states and counts, and
    takes the items (`Shard.with_items`) only of the shard it claims."""
    query = unfinished_query(campaign)
    selected = kube.list(
        SHARDS, namespace, label_selector=query["labelSelector"], fieldSelector=query["fieldSelector"]
    )
    return [Shard.parse_items_counted(item) for item in selected]
