"""A recorded retry request acted on (`Retry`): spec.retry.generation ahead of
status.lastRetryGeneration sends the Blocked and Failed shards (all, or those spec.retry.shards
lists) back to Pending, once; the RetryStarted Event follows the status write that records it.

A request for all of them also starts a walk of the ledger (`status.folded.retryWalk`): the gave-up
shards folded into it are cut again from their ledger lines, one segment a pass and no more than
the backlog bound leaves room for, so a retry of 50,000 folded shards never creates them at once.
A shard cut again leaves status.folded (its index, its phase's count) in the status write of the
pass that cut it; a pass whose write is lost leaves a Shard the next pass deletes as folded, and
the walk cuts it again."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from shardops.api.enums import ShardPhase
from shardops.api.folded import FoldedShards, RetryWalk
from shardops.k8s import campaigns
from shardops.k8s.api import KubeClient
from shardops.k8s.shards import TransitionRequest
from shardops.logic import backpressure, conditions, ranges
from shardops.logic import retry as retry_logic
from shardops.logic.transitions import Action
from shardops.scheduler import builders
from shardops.scheduler.observed import Observed
from shardops.scheduler.writes import ShardWrites
from shardops.state import ledger, shardview
from shardops.store.installation import Stores
from shardops.store.records import StoreUnavailable

log = logging.getLogger(__name__)

# The operator acts on a retry request (the CLI records the request itself as RetryRequested).
RETRY_STARTED = "RetryStarted"


@dataclass(frozen=True)
class RetryResult:
    """A retry request acted on: the generation the status records, the note its Event carries."""

    generation: int
    note: str


class Retry:
    def __init__(self, kube: KubeClient, writes: ShardWrites, stores: Stores) -> None:
        self.kube = kube
        self.writes = writes
        self.stores = stores

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
        folded = campaign.current_status.folded.gave_up
        note = (
            f"spec.retry.generation={wanted} ({scope}): {len(retried)} shard(s) back to Pending"
            + conditions.listing(retried)
            + retry_logic.skipped_text(choice.skipped)
            + (
                f"; {folded} folded into the ledger are cut again as the backlog leaves room"
                if folded and listed is None
                else ""
            )
        )
        return RetryResult(wanted, note)

    def start_walk(self, seen: Observed, retried: RetryResult | None) -> FoldedShards:
        """status.folded with a walk of the ledger started when `retried` is a request for every
        gave-up shard and some are folded (recorded by the status write that records the request)."""
        folded = seen.campaign.current_status.folded
        if retried is None or seen.campaign.spec.retry.shards is not None or not folded.gave_up:
            return folded
        walk = RetryWalk(generation=retried.generation, next=1, until=folded.sequence)
        return folded.model_copy(update={"retry_walk": walk})

    def recut(self, seen: Observed, folded: FoldedShards, now: dt.datetime) -> FoldedShards:
        """One step of the walk: the folded gave-up shards of its next ledger segment cut again (as
        Pending, retryGeneration set), as many as the backlog bound leaves room for; `folded`
        without them, the walk moved on once its segment holds none still folded."""
        walk = folded.retry_walk
        store = self.stores.ledger(seen.campaign)
        if walk is None or store is None:
            return folded
        campaign = seen.campaign
        phases = [shardview.phase_of(s) for s in seen.shards.values()]
        room = backpressure.backlog_room(
            phases.count(ShardPhase.PENDING), campaign.spec.backlog_ratio, phases.count(ShardPhase.RUNNING)
        )
        try:
            lines = store.read_ledger_sequence(campaign.name, campaign.metadata.uid or "", walk.next)
        except StoreUnavailable as error:
            log.warning("campaign %s: ledger not readable, retrying later: %s", campaign.name, error)
            return folded
        spans = folded.ranges()
        # One segment's gave-up lines (at most a few MAX_FOLD), each index once, in index order:
        # `walk.handled` counts the ones already dealt with, so one cut again and folded anew since
        # is not cut twice.
        gave_up: dict[int, dict[str, object]] = {}
        for line in lines:
            index = line.get("index")
            if isinstance(index, int) and ledger.record_phase(line) in ledger.GAVE_UP:
                gave_up.setdefault(index, line)
        todo = [gave_up[index] for index in sorted(gave_up)][walk.handled :]
        cut: list[dict[str, object]] = []
        handled = walk.handled
        for line in todo:
            index = int(str(line["index"]))
            if ranges.contains(spans, index):  # else live already (retried before it was folded)
                if len(cut) >= room:
                    break
                shard = self.writes.create(seen, builders.shard_body(campaign, index, seen.items))
                if shard is None:
                    break
                request = TransitionRequest(
                    Action.MATERIALIZE,
                    f"cut again from the ledger by spec.retry.generation={walk.generation}",
                    updates={"retry_generation": walk.generation},
                )
                self.writes.transition(seen, shard, request, now)
                cut.append(line)
            handled += 1
        unfolded = ledger.unfold(folded, cut)
        if handled < walk.handled + len(todo):  # the rest of this segment waits for room
            return unfolded.model_copy(update={"retry_walk": walk.model_copy(update={"handled": handled})})
        following = walk.next + 1
        after = RetryWalk(generation=walk.generation, next=following, until=walk.until)
        return unfolded.model_copy(update={"retry_walk": after if following <= walk.until else None})

    def announce(self, seen: Observed, retried: RetryResult | None, now: dt.datetime) -> None:
        """After the status write that records the request as acted on."""
        if retried is None:
            return
        campaigns.record_event(
            self.kube, seen.body, reason=RETRY_STARTED, note=retried.note, actor=self.writes.actor, now=now
        )
