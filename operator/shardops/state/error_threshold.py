"""The error threshold on live objects: the attempt endings in the shards' history, and whether the
campaign is held.

The hold is the Campaign's ErrorThreshold condition (True), written by the operator when
`logic.error_threshold` trips. It lasts until a person resumes the campaign: `kubectl campaign
resume` records the time in the `shardops.dev/resumed` annotation, and a resume later than the
condition's lastTransitionTime lifts it. Only endings after the latest resume count, so the same
old failures do not hold the campaign again.

Cost: the shards given are the live window (pending, running, the ones that need a person and a
short tail of finished ones), each with its bounded history.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from shardops.api.campaign import Campaign
from shardops.api.enums import ConditionStatus, ConditionType
from shardops.api.names import RESUMED_ANNOTATION
from shardops.api.shard import Shard
from shardops.logic import conditions
from shardops.logic.conditions import DesiredCondition
from shardops.logic.error_threshold import AttemptEnd, Trip, error_threshold_trip
from shardops.logic.timefmt import parse_rfc3339
from shardops.logic.transitions import EventReason

# The shard name of a folded completion (its Shard object is gone).
FOLDED = "(folded)"


def resumed_at(campaign: Campaign) -> dt.datetime | None:
    text = (campaign.metadata.annotations or {}).get(RESUMED_ANNOTATION)
    if not text:
        return None
    try:
        return parse_rfc3339(text)
    except ValueError:
        return None


def held(campaign: Campaign) -> bool:
    """True while the ErrorThreshold condition holds and no resume came after it."""
    condition = campaign.current_status.condition(str(ConditionType.ERROR_THRESHOLD))
    if condition is None or condition.status != "True":
        return False
    resumed = resumed_at(campaign)
    return resumed is None or resumed <= condition.last_transition_time


def hold_text(campaign: Campaign) -> str | None:
    """While held: what holds the campaign, in the condition's words (the rule that tripped, the
    failure class and an example shard with its error), for plan and status texts."""
    if not held(campaign):
        return None
    condition = campaign.current_status.condition(str(ConditionType.ERROR_THRESHOLD))
    assert condition is not None
    return _hold(condition.message)


def tripped_text(condition: DesiredCondition) -> str | None:
    """The hold text of an ErrorThreshold condition a pass decided (`error_threshold_condition`)
    before it is written: the pass that finds the trip cuts nothing and pauses its Pending shards
    itself, rather than leaving them to workers until the next pass reads the condition back."""
    if condition.status != ConditionStatus.TRUE:
        return None
    return _hold(condition.message)


def _hold(message: str) -> str:
    return f"held by its error threshold (condition ErrorThreshold): {message}"


def _trip(campaign: Campaign, shards: list[Shard]) -> Trip | None:
    # Only the operator decides a trip: it sees every live shard, Done ones included. A worker lists
    # only the unfinished shards, so it could not tell five failures in a row from five among many
    # successes; it acts on the condition the operator wrote (`held`).
    rule = campaign.spec.error_threshold
    since = resumed_at(campaign)
    # Shards folded into the ledger are gone from the listing; their completions and non-retryable
    # failures are kept (status.folded), so folding never hides a failure from the threshold.
    kept = campaign.current_status.folded
    folded = [AttemptEnd(at, FOLDED, None) for at in kept.recent_completions if since is None or at > since]
    folded += [
        AttemptEnd(f.at, f.shard, f.error_class)
        for f in kept.recent_failures
        if since is None or f.at > since
    ]
    ends = sorted([*attempt_ends(shards, since), *folded], key=lambda e: (e.at, e.shard))
    return error_threshold_trip(ends, rule.consecutive, rule.ratio, rule.window)


def attempt_ends(shards: Iterable[Shard], since: dt.datetime | None) -> list[AttemptEnd]:
    """Done and non-retryable Failed endings after `since`, oldest first (a Done shard all of whose
    items errored is a failure: `ShardStatus.failed_item_by_item`)."""
    ends = []
    for shard in shards:
        for entry in shard.current_status.history:
            if since is not None and entry.at <= since:
                continue
            if entry.reason == EventReason.COMPLETED:
                ends.append(AttemptEnd(entry.at, shard.name, shard.current_status.failed_item_by_item()))
            elif (
                entry.reason == EventReason.FAILED
                and entry.error_class is not None
                and not entry.error_class.retryable
            ):
                ends.append(AttemptEnd(entry.at, shard.name, entry.error_class))
    ends.sort(key=lambda e: (e.at, e.shard))
    return ends


def error_threshold_condition(campaign: Campaign, shards: Iterable[Shard]) -> DesiredCondition:
    """The ErrorThreshold condition this pass: kept while held, else decided from the endings since
    the last resume."""
    previous = campaign.current_status.condition(str(ConditionType.ERROR_THRESHOLD))
    if held(campaign) and previous is not None:
        return conditions.error_threshold(previous.message)
    shards = list(shards)
    trip = _trip(campaign, shards)
    if trip is None:
        return conditions.error_threshold(None)
    example = next((s for s in shards if s.name == trip.shard), None)
    error = example.current_status.last_error if example is not None else None
    detail = f": {error.message}" if error is not None and error.message else ""
    return conditions.error_threshold(
        f"{trip.rule}; mostly {trip.error_class}, for example shard {trip.shard}{detail}. No shard is "
        f"claimed: fix the cause, then kubectl campaign resume {campaign.name}"
    )
