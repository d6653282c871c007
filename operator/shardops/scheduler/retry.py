"""A recorded retry request acted on (`Retry`): spec.retry.generation ahead of
status.lastRetryGeneration sends the Blocked and Failed shards (all, or those spec.retry.shards
lists) back to Pending, once; the RetryStarted Event follows the status write that records it.

A request for all of them also starts a walk of the ledger (`status.folded.retryWalk`): the gave-up
shards folded into it are cut again from their ledger lines, one segment a pass and no more than
the backlog bound leaves room for, so a retry of 50,000 folded shards never creates them at once.
A shard cut again leaves status.folded (its index, its phase's count) in the status write of the
pass that cut it; a pass whose write is lost leaves a Shard the next pass deletes as folded, and
the walk cuts it again.

A request for the errored items (spec.retry.errored) does the same for the Done shards with items
that errored on their own: a live one goes back to Pending, a folded one is cut again from its
ledger line, each with status.rerunErrored and its result (the one its items errored in), so the
worker runs just the errored items and keeps the others' results (worker/tally.py)."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from shardops.api.enums import ShardPhase
from shardops.api.folded import FoldedShards, RetryWalk
from shardops.api.shard import ShardResult
from shardops.k8s import campaigns, leases
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
        if campaign.spec.retry.errored:
            return self.act_errored(seen, now)
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

    def act_errored(self, seen: Observed, now: dt.datetime) -> RetryResult:
        """spec.retry.errored: every live Done shard with errored items back to Pending to run just
        those (status.rerunErrored), once per generation (status.retryGeneration, as for `act`)."""
        campaign = seen.campaign
        wanted = campaign.spec.retry.generation
        retried: list[str] = []
        for name in sorted(seen.shards):
            shard = seen.shards[name]
            status = shard.current_status
            if shardview.phase_of(shard) is not ShardPhase.DONE or not status.errored_items:
                continue
            if (status.retry_generation or 0) >= wanted:
                continue  # rerun by this request already
            # A Done shard keeps its Lease held (its holder never writes again): freed, so a worker
            # can claim the shard back (one read and one write per such shard, within the window).
            lease = leases.read(self.kube, shard.namespace, shard.lease_name)
            if (
                lease is not None
                and leases.holder_and_token(lease)[0]
                and not leases.revoke(self.kube, lease)
            ):
                continue  # changed since read: the next pass tries again
            request = TransitionRequest(
                Action.RETRY_ERRORED,
                f"its {status.errored_items} errored item(s) run again by spec.retry.generation={wanted}",
                updates={
                    "not_before": None,
                    "owner": None,
                    "lease_until": None,
                    "retry_generation": wanted,
                    "rerun_errored": True,
                },
            )
            if self.writes.transition(seen, shard, request, now):
                retried.append(name)
        folded = campaign.current_status.folded.errored_items
        note = (
            f"spec.retry.generation={wanted} (errored items): {len(retried)} Done shard(s) back to Pending "
            "to run their errored items"
            + conditions.listing(retried)
            + (
                f"; {folded} errored item(s) of folded shards are cut again as the backlog leaves room"
                if folded
                else ""
            )
        )
        return RetryResult(wanted, note)

    def start_walk(self, seen: Observed, retried: RetryResult | None) -> FoldedShards:
        """status.folded with a walk of the ledger started when `retried` is a request for every
        gave-up shard and some are folded, or for the errored items and some folded Done shard has
        any (recorded by the status write that records the request)."""
        folded = seen.campaign.current_status.folded
        if retried is None:
            return folded
        if seen.campaign.spec.retry.errored:
            if not folded.errored_items:
                return folded
            walk = RetryWalk(generation=retried.generation, next=1, until=folded.sequence, errored=True)
            return folded.model_copy(update={"retry_walk": walk})
        if seen.campaign.spec.retry.shards is not None or not folded.gave_up:
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
        # One segment's lines to cut again (at most a few MAX_FOLD), each index once, in index order:
        # the gave-up ones, or the Done ones with errored items for a walk of the errored items.
        # `walk.handled` counts the ones already dealt with, so one cut again and folded anew since
        # is not cut twice.
        wanted: dict[int, dict[str, object]] = {}
        for line in lines:
            index = line.get("index")
            if isinstance(index, int) and _to_cut_again(line, bool(walk.errored)):
                wanted.setdefault(index, line)
        todo = [wanted[index] for index in sorted(wanted)][walk.handled :]
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
                    f"cut again from the ledger by spec.retry.generation={walk.generation}"
                    + (" to run its errored items" if walk.errored else ""),
                    updates={
                        "retry_generation": walk.generation,
                        **(_rerun_updates(line) if walk.errored else {}),
                    },
                )
                self.writes.transition(seen, shard, request, now)
                cut.append(line)
            handled += 1
        unfolded = ledger.unfold(folded, cut)
        if handled < walk.handled + len(todo):  # the rest of this segment waits for room
            return unfolded.model_copy(update={"retry_walk": walk.model_copy(update={"handled": handled})})
        following = walk.next + 1
        after = RetryWalk(generation=walk.generation, next=following, until=walk.until, errored=walk.errored)
        return unfolded.model_copy(update={"retry_walk": after if following <= walk.until else None})

    def announce(self, seen: Observed, retried: RetryResult | None, now: dt.datetime) -> None:
        """After the status write that records the request as acted on."""
        if retried is None:
            return
        campaigns.record_event(
            self.kube, seen.body, reason=RETRY_STARTED, note=retried.note, actor=self.writes.actor, now=now
        )


def _to_cut_again(line: dict[str, object], errored: bool) -> bool:
    """Whether a walk cuts this ledger line's shard again: a Done one with errored items for a walk
    of the errored items, else a gave-up one."""
    if errored:
        return ledger.errored_items(line) > 0
    return ledger.record_phase(line) in ledger.GAVE_UP


def _rerun_updates(line: dict[str, object]) -> dict[str, object]:
    """The status a folded Done shard is cut again with to run its errored items: rerunErrored, and
    the result they errored in (the worker reads the other items' results from it)."""
    result = line.get("result")
    return {
        "rerun_errored": True,
        **({"result": ShardResult.model_validate(result)} if isinstance(result, dict) else {}),
    }
