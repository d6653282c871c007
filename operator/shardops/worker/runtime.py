"""The worker loop (`Worker`, one per slot): observe, claim a shard, run it to an outcome, repeat
until there is nothing left to do.

One shard at a time per slot: a claimed shard is run by a ShardRun (shardrun.py) and ends in an
Outcome (holding.py). A worker process runs spec.worker.slots such loops, each in its own thread,
sharing what one process needs once (slots.py: `SlotGroup`, `run_slots`). What a slot observes
before it claims is its `Observed` (observed.py), read or watched.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from shardops.api.campaign import Campaign, SourceCooldown
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.api.store import ResultStoreStatus
from shardops.k8s.api import Forbidden, KubeClient, NotFound
from shardops.k8s.shards import Actor
from shardops.logic.leases import Renewals
from shardops.state import cooldowns, shardview
from shardops.store import ResultStore, location_of, open_store
from shardops.worker.claim import ClaimContext, Claimed, choose, claim, exit_reason, uncut_shards
from shardops.worker.clocks import Clock, SystemClock
from shardops.worker.holding import TRANSIENT_ERRORS, Outcome
from shardops.worker.items import ShardItems, stored_of
from shardops.worker.logs import emit, log
from shardops.worker.metrics import ClaimOutcome, WorkerMetrics
from shardops.worker.observed import Observed, Observer, ReadObserver, Wake, own, read_observed
from shardops.worker.persistent import CommandServer, served_process_env
from shardops.worker.runner import SHARD_VARIABLES, CommandFailure, campaign_variables, command_env
from shardops.worker.settings import WorkerSettings
from shardops.worker.shardrun import ShardRun
from shardops.worker.slots import Held, SlotGroup

CONTROLLER = "shardops.dev/worker"
# A claim lost on a shard is not tried again at the same version for this long: enough for the
# winner's claim to reach a watched copy, short enough that a winner that crashed between its Lease
# and its claim write costs little (its Lease runs out anyway before the shard is claimable).
LOST_CLAIM_SECONDS = 5.0
# After a watched change, an idle worker waits a random part of its spread before it observes, so
# idle workers that all saw one new shard do not all race for it at once. The spread starts here,
# doubles with every claim the worker loses (more workers are racing than the spread keeps apart)
# up to MAX_SPREAD_SECONDS, and halves with every claim it wins: binary exponential backoff, as
# Ethernet spaces out senders that collided. A lost race costs a Lease create the API server
# refuses (409) and the worker's own observation; without it, 20 idle workers met every new shard of a
# zero-work campaign together and lost 16 creates for each one won.
SPREAD_SECONDS = 0.05
MAX_SPREAD_SECONDS = 1.0


@dataclass(frozen=True)
class _Won:
    """A claim a slot won, with what its run needs of what was observed when it was made."""

    campaign: Campaign
    claimed: Claimed
    # The cooldowns as observed then: no other read (state.cooldowns).
    cooling: Mapping[str, SourceCooldown]


@dataclass
class Worker:
    """One slot: what stays the same across its shards: the API, the identity, the settings, the
    clock, and what it shares with the other slots of its process (`group`)."""

    kube: KubeClient
    settings: WorkerSettings
    namespace: str
    campaign_name: str
    clock: Clock = field(default_factory=SystemClock)
    rng: random.Random = field(default_factory=random.Random)
    stop: threading.Event = field(default_factory=threading.Event)
    # The slot's number in its process (0 .. spec.worker.slots - 1): its holder identity's suffix.
    slot: int = 0
    # Shared with the other slots of the process; None: a group of one, made here.
    group: SlotGroup | None = None
    # This slot holds a shard (its Lease won, its outcome not yet reached): SlotGroup.busy.
    _holding: bool = False
    # The campaign's spec.idleSeconds as last read; used unless SHARDOPS_IDLE_SECONDS overrides it.
    _campaign_idle: int = 30
    # The campaign had items not yet cut into shards when last observed: the operator cuts more as soon
    # as the backlog has room, so a worker waits for them instead of going idle.
    _more_coming: bool = False
    # The last observation passed claimable shards by only because their claim was lost a moment ago
    # (`_lost_recently`): work that is still there, not idleness. A lost race's winner usually shows
    # Running soon, but the Lease it lost on may be a claimer's that crashed before its claim write, or
    # one left held for an earlier Shard of the name (k8s.leases.owned_by_an_earlier); the slot tries
    # it again once the window has passed instead of leaving it Pending with nobody to take it.
    _passed_by: bool = False
    # How the slot observes the campaign and its unfinished shards (worker.observed); None: a read
    # per observation.
    observer: Observer | None = None
    # Shards whose claim this process lost, or a sibling slot won, are in `group` (SlotGroup.lose):
    # a watched copy shows the winner's claim only once its event arrives; until the shard changes
    # (or LOST_CLAIM_SECONDS pass) trying it again would only lose again.
    # The current spread (SPREAD_SECONDS) and whether the last observation ended with a lost claim.
    _spread: float = SPREAD_SECONDS
    _lost_last: bool = False
    # The items of the shards it claims (items.py).
    items: ShardItems = field(init=False)
    # When this worker last saw each claim of its window renewed, on its own clock: zombies are
    # judged from it (`logic.leases`, "Whose clock").
    renewals: Renewals = field(init=False)
    # The persistent command's process between shards (spec.worker.persistent), ended at close().
    commands: CommandServer = field(init=False)
    # The campaign as the slot last observed it, and whether its persistent command was started
    # ahead of its first shard (`start_command_ahead`).
    _observed_campaign: Campaign | None = None
    _started_ahead: bool = False
    # Whether the last observation was read from the API server (not the watched copy), and whether
    # the next one must be: leaving for want of work waits for a read that finds none (`_loop`).
    _observed_fresh: bool = False
    _read_next: bool = False

    def __post_init__(self) -> None:
        if self.group is None:
            # Labelled as the operator labels its campaign metrics, so one dashboard variable fits both.
            self.group = SlotGroup(WorkerMetrics(f"{self.namespace}/{self.campaign_name}"))
        self.items = ShardItems(self.kube, self.namespace)
        self.renewals = Renewals(self.clock.monotonic)
        self.commands = CommandServer(self.settings.work_dir, self.settings.keep_work_dir)
        if self.observer is None:
            self.observer = ReadObserver(self.kube, self.namespace, self.campaign_name)

    @property
    def shared(self) -> SlotGroup:
        assert self.group is not None
        return self.group

    @property
    def metrics(self) -> WorkerMetrics:
        """The process's Prometheus figures, of all its slots (main serves them when
        SHARDOPS_METRICS_PORT is set)."""
        return self.shared.metrics

    @property
    def holder(self) -> str:
        return self.settings.identity_of(self.slot)

    @property
    def actor(self) -> Actor:
        return Actor(CONTROLLER, self.holder)

    def wait(self, seconds: float) -> bool:
        """Sleep unless stopped; True when a stop was requested."""
        return self.stop.wait(max(seconds, 0.0))

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> int:
        """Exit code: 0 when there is nothing (left) to do or on a graceful stop, 1 on a fatal error."""
        try:
            return self._loop()
        finally:
            # The pod leaves as a whole (SlotGroup): the other slots follow after their shard.
            self.shared.leaving.set()
            self.close()

    def _loop(self) -> int:
        emit("started", holder=self.holder, campaign=self.campaign_name, namespace=self.namespace)
        idle_since = self.clock.monotonic()
        finished = 0
        while not self.stop.is_set():
            if self.shared.leaving.is_set():
                emit(
                    "exiting",
                    reason="another slot of this pod left: the pod leaves as a whole",
                    shards=finished,
                )
                return 0
            try:
                step = self._step()
            except Forbidden as error:
                emit("fatal", reason="forbidden", message=error.message)
                return 1
            except TRANSIENT_ERRORS as error:
                log.warning("API trouble, retrying: %s", error)
                self.wait(self.settings.poll_seconds)
                continue
            if isinstance(step, Outcome):
                finished += 1
                idle_since = self.clock.monotonic()
                if self.settings.max_shards and finished >= self.settings.max_shards:
                    emit("exiting", reason=f"did {finished} shard(s), the most allowed", shards=finished)
                    return 0
                continue
            if step is not None:
                emit("exiting", reason=step, shards=finished)
                return 0
            if self._lost_last:
                # Others are racing for the same shards: observe again (there may be more to claim)
                # after a random part of the spread, not at once and not only at the next change.
                self.wait(self.rng.random() * self._spread)
                continue
            if self._more_coming or self.shared.busy or self._passed_by:
                # A slot of a busy process waits on: the pod goes when all its slots are idle.
                idle_since = self.clock.monotonic()
            idle = self._idle_seconds()
            waited = self.clock.monotonic() - idle_since
            if waited >= idle and not self._passed_by:
                if not self._observed_fresh:
                    # Leaving is not taken back, and the watched copy may lag: by the event of this
                    # slot's own last Done write, or of a shard made Pending a moment ago. The next
                    # step reads; the slot leaves when that read finds nothing to claim either.
                    self._read_next = True
                    continue
                emit("exiting", reason=f"no claimable shard for {waited:.0f}s", shards=finished)
                return 0
            # Jitter so workers that went idle together do not poll in lockstep.
            pause = self.settings.poll_seconds * (0.5 + self.rng.random())
            self.wait_for_work(pause if self._passed_by else min(pause, idle - waited))
        emit("exiting", reason="stop requested (SIGTERM)", shards=finished)
        return 0

    def close(self) -> None:
        assert self.observer is not None
        try:
            self.commands.close(self.settings.term_grace_seconds)
        finally:
            self.observer.close()

    def wait_for_work(self, seconds: float) -> None:
        """Until something may have made a shard claimable, or `seconds`. A watched change is
        followed by a pause of a random part of the spread, then the watched copy is asked whether
        a shard is Pending that this worker has not just lost (no request, no parse): when none is,
        someone else took the new shard during the pause, and the worker waits on without observing."""
        assert self.observer is not None
        deadline = self.clock.monotonic() + seconds
        while True:
            # On time without a change, the slot observes all the same: that also judges zombies.
            if self.observer.wait(deadline - self.clock.monotonic(), self.stop) is not Wake.CHANGE:
                return
            if self.wait(self.rng.random() * self._spread) or self._may_claim():
                return

    def _may_claim(self) -> bool:
        """A Pending shard is in the watched copy that this worker did not just lose (or no copy)."""
        assert self.observer is not None
        pending = self.observer.pending(self.clock.now())
        if pending is None:
            return True
        return any(not self._lost_at(name, version) for name, version in pending.items())

    def _idle_seconds(self) -> float:
        if self.settings.idle_seconds is not None:
            return self.settings.idle_seconds
        return float(self._campaign_idle)

    def _step(self) -> Outcome | str | None:
        """One pass for work: an Outcome when a shard was claimed and run, a reason to exit, or None.
        Observing and choosing hold the process's claim lock (SlotGroup) until the chosen shard is
        reserved for this slot; its Lease create, the claim write and the run do not."""
        try:
            held = Held(self.shared.claiming)
            try:
                found = self._claim_one(held)
            finally:
                held.release()
            if not isinstance(found, str) and self._observed_campaign is not None:
                self.start_command_ahead(self._observed_campaign)
            if not isinstance(found, _Won):
                return found
            run = ShardRun(self, found.campaign, found.claimed, cooldowns=found.cooling)
            outcome = run.execute()
            # Every claimed shard ends here, whichever way: the one place its outcome is counted.
            error_class = run.error_class if outcome is Outcome.FAILED else None
            self.metrics.observe_shard(run.shard.spec.shard_class, outcome, error_class)
            return outcome
        finally:
            if self._holding:
                self._holding = False
                self.shared.hold(False)

    def _claim_one(self, held: Held) -> _Won | str | None:
        """Observe, and claim a shard of what was observed: what was won, a reason to exit, or None.
        `held`: the claim lock, released once a shard is chosen and reserved."""
        assert self.observer is not None
        observed = self._observe(self._read_fresh if self._read_next else self.observer.observe)
        self._read_next = False
        decided = exit_reason(observed, self.namespace, self.campaign_name, self.settings.campaign_uid)
        if decided is not None and (observed is None or not observed.fresh):
            # A watched copy may lag (two watches, each an event behind at most): exit only on a
            # fresh read that agrees (one more read of a gone campaign that was read already).
            observed = self._observe(self._read_fresh)
            decided = exit_reason(observed, self.namespace, self.campaign_name, self.settings.campaign_uid)
        self._observed_fresh = observed is None or observed.fresh
        if decided is not None or observed is None:
            return decided
        campaign, shards = observed.campaign, observed.unfinished
        self._observed_campaign = campaign
        self._campaign_idle = campaign.spec.idle_seconds
        self._more_coming = uncut_shards(campaign, shards) > 0
        self.shared.keep_only({shard.name for shard in shards})
        silent = self._silences(shards)
        chosen = choose(campaign, shards, self.clock.now(), self.settings.claim_candidates, self.rng, silent)
        candidates = [candidate for candidate in chosen if not self._lost_recently(candidate.shard)]
        self._passed_by = len(candidates) < len(chosen)
        self._lost_last = False
        if not candidates:
            self.metrics.observe_claim(ClaimOutcome.NONE)
            return None
        if self.stop.is_set():
            return None
        # One candidate per observation: a won claim runs, a lost race means the others on its list
        # are likely raced for too (the loop observes again after a pause, `_loop`).
        candidate = candidates[0]
        version = candidate.shard.metadata.resource_version or ""
        # Lost before (its Lease exists: read it before taking it), not counting the reservation.
        lost_before = self.shared.lost(candidate.shard.name) is not None
        # Reserved: from here the siblings pass this shard by at this version (SlotGroup), so the
        # lock goes now and their observations and Lease creates overlap this slot's Lease create.
        self.shared.lose(candidate.shard.name, version, self.clock.monotonic())
        held.release()
        context = ClaimContext(
            kube=self.kube,
            namespace=self.namespace,
            holder=self.holder,
            actor=self.actor,
            now=self.clock.now,
            items_of=lambda shard: self.items.of(campaign, shard),
            stored_of=lambda shard, items: stored_of(self.store_for(campaign), shard, items),
            store=lambda: self.store_for(campaign),
            seen=self.renewals,
            lost_before=lambda shard: lost_before,
            leased=self._taken,
        )
        try:
            claimed = claim(context, campaign, candidate)
        except BaseException:
            # Not lost to anyone (the Lease, if won, was let go): the next observation tries it again,
            # reading its Lease first (it may exist: lost_before), not passing it by as taken.
            expired = self.clock.monotonic() - LOST_CLAIM_SECONDS - 1
            self.shared.lose(candidate.shard.name, version, expired)
            raise
        if claimed is None:
            # Lost: at this version the shard is no sibling slot's to try (SlotGroup); a win was
            # recorded so when its Lease was won (`_taken`).
            self.shared.lose(candidate.shard.name, version, self.clock.monotonic())
            self.metrics.observe_claim(ClaimOutcome.LOST)
            emit("claim-lost", shard=candidate.shard.name)
            self._spread = min(self._spread * 2, MAX_SPREAD_SECONDS)
            self._lost_last = True
            return None
        self._spread = max(self._spread / 2, SPREAD_SECONDS)
        self.metrics.observe_claim(ClaimOutcome.WON)
        emit(
            "claimed",
            shard=claimed.shard.name,
            attempt=claimed.shard.current_status.attempt,
            token=claimed.lease.fencing_token,
            source=claimed.source,
            resumed=len(claimed.stored),
            reclaimed_from=claimed.reclaimed_from,
            holder=self.holder,
            at=time.time(),
        )
        # The cooldowns as of the listing just made: no other read (state.cooldowns).
        return _Won(campaign, claimed, cooldowns.source_cooldowns(campaign, shards, self.clock.now()))

    def _taken(self, shard: Shard) -> None:
        """This slot won `shard`'s Lease: its siblings go on passing the shard by (at the version they
        see: its reservation renewed for LOST_CLAIM_SECONDS) and count the process busy."""
        self.shared.lose(shard.name, shard.metadata.resource_version or "", self.clock.monotonic())
        if not self._holding:
            self._holding = True
            self.shared.hold(True)

    def start_command_ahead(self, campaign: Campaign) -> None:
        """Once per slot, after it first observed: start the campaign's persistent command
        (spec.worker.persistent) before the slot's first shard needs it, so the process's start (an
        interpreter and its imports, seconds while a campaign's workers all start at once) overlaps
        the slot's wait for its first claim. Its environment is the one every shard's process gets
        (`served_process_env`), so the first shard takes it; a command that cannot start is left to
        that shard, which fails naming why."""
        if self._started_ahead:
            return
        self._started_ahead = True
        worker_spec = campaign.spec.worker
        if not worker_spec.runs_persistent():
            return
        env = command_env(os.environ, campaign_variables(campaign, worker_spec), worker_spec.env_dict())
        try:
            self.commands.start_ahead(worker_spec.full_command(), served_process_env(env, SHARD_VARIABLES))
        except CommandFailure as failure:
            log.info("the persistent command did not start ahead; its first shard says why: %s", failure)

    def _silences(self, shards: Sequence[Shard]) -> dict[str, float]:
        """How long this worker has not seen each Running shard's claim renewed. Kept for every shard
        observed (bounded by the window): a Pending shard's Lease judged at a claim stays timed."""
        self.renewals.keep_only([shard.lease_name for shard in shards])
        return {
            shard.name: shardview.claim_silence(self.renewals, shard, None)
            for shard in shards
            if shard.phase is ShardPhase.RUNNING
        }

    def _read_fresh(self) -> Observed:
        """The campaign and its unfinished shards read from the API server, not the watched copy."""
        return read_observed(self.kube, self.namespace, self.campaign_name)

    @staticmethod
    def _observe(how: Callable[[], Observed]) -> Observed | None:
        """What `how` observed of the campaign's own unfolded shards (`observed.own`); None when
        the campaign does not exist."""
        try:
            return own(how())
        except NotFound:
            return None

    def _lost_recently(self, shard: Shard) -> bool:
        """This process lost (or a sibling slot won) the claim of `shard` as it is now, a moment ago:
        the winner's claim has not reached the copy yet. (Bounded by the window: pruned to the
        observed shards, `SlotGroup.keep_only`.)"""
        return self._lost_at(shard.name, shard.metadata.resource_version or "")

    def _lost_at(self, name: str, version: str) -> bool:
        lost = self.shared.lost(name)
        if lost is None:
            return False
        lost_version, at = lost
        return lost_version == version and self.clock.monotonic() - at <= LOST_CLAIM_SECONDS

    def store_for(self, campaign: Campaign) -> ResultStore:
        """The result store the campaign's status names (opened once per location)."""
        location: ResultStoreStatus = location_of(campaign)
        return self.shared.store(
            location.model_dump_json(),
            lambda: open_store(self.kube, self.namespace, location, self.settings.result_max_bytes),
        )
