"""A recorded retry request acted on (`Retry`): spec.retry.generation ahead of
status.lastRetryGeneration sends the Blocked and Failed shards (all, or those spec.retry.shards
lists) back to Pending, once; the RetryStarted Event follows the status write that records it."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from shardops.k8s import campaigns
from shardops.k8s.api import KubeClient
from shardops.k8s.shards import TransitionRequest
from shardops.logic import conditions
from shardops.logic import retry as retry_logic
from shardops.logic.transitions import Action
from shardops.scheduler.observed import Observed
from shardops.scheduler.writes import ShardWrites
from shardops.state import shardview

# The operator acts on a retry request (the CLI records the request itself as RetryRequested).
RETRY_STARTED = "RetryStarted"


@dataclass(frozen=True)
class RetryResult:
    """A retry request acted on: the generation the status records, the note its Event carries."""

    generation: int
    note: str


class Retry:
    def __init__(self, kube: KubeClient, writes: ShardWrites) -> None:
        self.kube = kube
        self.writes = writes

    def act(self, seen: Observed, now: dt.datetime) -> RetryResult | None:
        """spec.retry.generation ahead of status.lastRetryGeneration: retry the Blocked and Failed shards
        (all of them, or those spec.retry.shards lists) once. Returns what was done, for the status
        write of this pass to record (lastRetryGeneration) and then announce; None without a request.

        Each retried shard records the generation in the same write that retries it
        (status.retryGeneration), so a pass that runs the request again (its status write lost, or
        a new leader) counts those shards as retried and leaves them alone, even when they have
        given up again since."""
        campaign = seen.campaign
        if not campaign.retry_requested:
            return None
        wanted = campaign.spec.retry.generation
        listed = campaign.spec.retry.shards
        applied = {
            name
            for name, shard in seen.shards.items()
            if (shard.current_status.retry_generation or 0) >= wanted
        }
        choice = retry_logic.choose_retry(
            {name: shardview.phase_of(shard) for name, shard in seen.shards.items()}, listed, applied
        )
        retried = list(choice.applied)
        for name in choice.retry:
            request = TransitionRequest(
                Action.RETRY,
                f"retry requested by spec.retry.generation={wanted}",
                updates={"not_before": None, "owner": None, "lease_until": None, "retry_generation": wanted},
            )
            if self.writes.transition(seen, seen.shards[name], request, now):
                retried.append(name)
        retried.sort()
        scope = f"{len(set(listed))} listed" if listed else "every Blocked and Failed shard"
        note = (
            f"spec.retry.generation={wanted} ({scope}): {len(retried)} shard(s) back to Pending"
            + conditions.listing(retried)
            + retry_logic.skipped_text(choice.skipped)
        )
        return RetryResult(wanted, note)

    def announce(self, seen: Observed, retried: RetryResult | None, now: dt.datetime) -> None:
        """After the status write that records the request as acted on."""
        if retried is None:
            return
        campaigns.record_event(
            self.kube, seen.body, reason=RETRY_STARTED, note=retried.note, actor=self.writes.actor, now=now
        )
