"""The worker loop: claim a shard, run it to an outcome, repeat until there is nothing left to do.

One shard at a time per slot: the loop polls the command's results file and exit, and heartbeats
when due. A worker process runs spec.worker.slots such loops (`Worker`, one per slot, each in its
own thread: `run_slots`), sharing what one process needs once (`SlotGroup`). A heartbeat (and
every later write) first proves the claim is still ours (heartbeat.py); if it is not, the command
is killed and nothing is written.

Outcomes of one claimed shard:

* reused: a verified result is already stored under the idempotency key -> Done, command not run;
* done: every item has a result (stored earlier or by this attempt) -> Done with result
  {ref, fingerprint, bytes};
* failed: the command failed, or its output, cost or size broke a rule -> Pending with notBefore,
  Failed or Blocked, as logic.errors decides;
* released: SIGTERM; the command was stopped and partial results flushed -> Pending, attempt not
  charged;
* fenced: the Lease or the shard is not ours any more -> untouched, the new holder owns it.

Partial results survive a crash up to the last heartbeat: each heartbeat flushes the item results
read since the previous one to the result store. Items a killed worker finished after its last
flush are computed again by the next attempt.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TypeVar

import urllib3

from shardops.api.campaign import Campaign, ItemsOverLimit, ResultStoreStatus, SourceCooldown, WorkerSpec
from shardops.api.common import NO_TOKENS, Item, TokenCounts
from shardops.api.enums import ErrorClass, ShardClass, ShardPhase, StoreType
from shardops.api.llm import COOLDOWN_FILE_ENV
from shardops.api.shard import Progress, Shard, ShardError, ShardResult
from shardops.clock import utcnow
from shardops.k8s import leases
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, SHARDS, ApiError, Forbidden, Kube, NotFound
from shardops.k8s.campaigns import ItemsUnavailable
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition, list_shards
from shardops.logic.backoff import retry_not_before
from shardops.logic.failures import classify_failure, next_phase_after_failure
from shardops.logic.idempotency import item_subkey
from shardops.logic.leases import Renewals
from shardops.logic.transitions import Action
from shardops.state import cooldowns, ledger, results, shardview
from shardops.store import ResultStore, location_of, open_store
from shardops.store.finished import commit_for_reuse
from shardops.store.items import campaign_items
from shardops.store.lines import ItemsChanged, NotJsonlText
from shardops.store.records import (
    ItemRecord,
    ResultMeta,
    ResultTooLarge,
    StoreCorrupt,
    StoredResult,
    StoreUnavailable,
    encode_result,
)
from shardops.store.s3 import S3Store
from shardops.worker import heartbeat
from shardops.worker.claim import ClaimContext, Claimed, choose, claim, stop_reason, uncut_shards
from shardops.worker.heartbeat import Fenced, FenceReason
from shardops.worker.look import Look, Looks, ReadLooks, Wake, read_look
from shardops.worker.metrics import (
    ClaimOutcome,
    CommandMode,
    CommandOutcome,
    HeartbeatOutcome,
    WorkerMetrics,
)
from shardops.worker.runner import (
    COOLDOWN_FILE,
    AttemptFiles,
    Command,
    CommandFailure,
    CommandServer,
    ResultLine,
    ResultsReader,
    ServedCommand,
    ShardCommand,
    WorkItem,
    command_env,
    read_error_file,
    served_process_env,
)
from shardops.worker.settings import WorkerSettings

log = logging.getLogger("shardops.worker")
T = TypeVar("T")

CONTROLLER = "shardops.dev/worker"
# API trouble that a later try may not have: keep the claim, try again next tick.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ApiError,
    urllib3.exceptions.HTTPError,
    OSError,
    StoreUnavailable,
)
# A heartbeat that failed for a transient reason is retried this soon, well inside the lease.
_HEARTBEAT_RETRY_SECONDS = 1.0
# A claim lost on a shard is not tried again at the same version for this long: enough for the
# winner's claim to reach a watched copy, short enough that a winner that crashed between its Lease
# and its claim write costs little (its Lease runs out anyway before the shard is claimable).
LOST_CLAIM_SECONDS = 5.0
# After a watched change, an idle worker waits a random part of its spread before it looks, so the
# idle workers that all saw one new shard do not all race for it at once. The spread starts here,
# doubles with every claim the worker loses (more workers are racing than the spread keeps apart)
# up to MAX_SPREAD_SECONDS, and halves with every claim it wins: binary exponential backoff, as
# Ethernet spaces out senders that collided. A lost race costs a Lease create the API server
# refuses (409) and the worker's own look; without it, 20 idle workers met every new shard of a
# zero-work campaign together and lost 16 creates for each one won.
SPREAD_SECONDS = 0.05
MAX_SPREAD_SECONDS = 1.0


# The protocol variables every shard's command gets with values of its own, in this order (a
# finalize shard and a shard of the built-in LLM worker get one more each: `ShardRun.run_command`).
SHARD_VARIABLES = (
    "SHARDOPS_ITEMS_FILE",
    "SHARDOPS_RESULTS_FILE",
    "SHARDOPS_ERROR_FILE",
    "SHARDOPS_SOURCE",
    "SHARDOPS_SHARD",
    "SHARDOPS_ATTEMPT",
    "SHARDOPS_IDEMPOTENCY_KEY",
)


def campaign_variables(campaign: Campaign, worker_spec: WorkerSpec) -> dict[str, str]:
    """The protocol variables every shard of `campaign` run by `worker_spec` gets the same."""
    return {"SHARDOPS_CAMPAIGN": campaign.name, **campaign.spec.command_settings(worker_spec)}


class Clock(Protocol):
    def now(self) -> dt.datetime: ...
    def monotonic(self) -> float: ...


@dataclass
class SystemClock:
    # The wall clock (`skew.ClockSkewSettings.wall_clock` shifts it for fault injection).
    wall: Callable[[], dt.datetime] = utcnow

    def now(self) -> dt.datetime:
        return self.wall()

    def monotonic(self) -> float:
        return time.monotonic()


class Outcome(StrEnum):
    REUSED = "reused"
    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"
    FENCED = "fenced"
    ABANDONED = "abandoned"


def emit(event: str, **fields: Any) -> None:
    """A structured log line (see main.JsonFormatter): what happened, to which shard, with figures."""
    log.info(event, extra={"fields": {"event": event, **fields}})


class SlotGroup:
    """What the slots of one worker process share: its metrics, its result stores (one S3 client per
    location), the claims it lost, won or is making, a lock that lets one slot at a time look and
    choose, and how many slots are running a shard.

    One slot at a time chooses, so slots never race each other for a shard: a slot records the
    shard it chose at the version it saw as reserved (with the lost and won ones) before it lets the
    lock go and creates the Lease, and a sibling, whose watched copy has not seen that claim yet,
    passes it by instead of losing a Lease create to it; the Lease creates of the slots overlap.
    Bounded by the window: the lost and taken claims are pruned to the shards a look sees.

    The pod leaves as a whole: once a slot leaves (idle, done, the campaign gone), `leaving` is set
    and every other slot leaves at its next turn, after its current shard, instead of claiming
    more; so the operator, which counts a Job's slots until the Job ends, never counts slots that
    are gone while the pod runs on with fewer."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.claiming = threading.Lock()
        self._lock = threading.Lock()
        self._stores: dict[str, ResultStore] = {}
        # Shard name -> (the version it was lost or taken at, monotonic time).
        self._lost: dict[str, tuple[str, float]] = {}
        self._running = 0
        self.leaving = threading.Event()

    def store(self, key: str, open_it: Callable[[], ResultStore]) -> ResultStore:
        """The store of `key`, opened once (outside the lock: opening may read credentials)."""
        with self._lock:
            found = self._stores.get(key)
        if found is not None:
            return found
        opened = open_it()
        with self._lock:
            return self._stores.setdefault(key, opened)

    def lose(self, name: str, version: str, at: float) -> None:
        with self._lock:
            self._lost[name] = (version, at)

    def lost(self, name: str) -> tuple[str, float] | None:
        with self._lock:
            return self._lost.get(name)

    def keep_only(self, present: set[str]) -> None:
        with self._lock:
            if len(self._lost) > len(present):
                self._lost = {name: lost for name, lost in self._lost.items() if name in present}

    def hold(self, holding: bool) -> None:
        """A slot won a shard's Lease (True) or is done with that shard (False)."""
        with self._lock:
            self._running += 1 if holding else -1

    @property
    def busy(self) -> bool:
        """A slot holds a shard (from its Lease won to its outcome): the process is not idle,
        whatever the other slots found."""
        with self._lock:
            return self._running > 0


class _Held:
    """A lock taken now, released once (by whichever comes first: a won Lease, or the end of the look)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._held = True
        lock.acquire()

    def release(self) -> None:
        if self._held:
            self._held = False
            self._lock.release()


@dataclass(frozen=True)
class _Won:
    """A claim a slot won, with what its run needs of the look it was made on."""

    campaign: Campaign
    claimed: Claimed
    # The cooldowns as of that look: no other read (state.cooldowns).
    cooling: Mapping[str, SourceCooldown]


@dataclass
class Worker:
    """One slot: what stays the same across its shards: the API, the identity, the settings, the
    clock, and what it shares with the other slots of its process (`group`)."""

    kube: Kube
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
    _items_cache: dict[tuple[str, str, str], list[Item]] = field(default_factory=dict)
    # The campaign's spec.idleSeconds as last read; used unless SHARDOPS_IDLE_SECONDS overrides it.
    _campaign_idle: int = 30
    # The campaign had items not yet cut into shards at the last look: the operator cuts more as soon
    # as the backlog has room, so a worker waits for them instead of going idle.
    _more_coming: bool = False
    # How a look gets the campaign and its unfinished shards (worker.look); None: a read per look.
    looks: Looks | None = None
    # Shards whose claim this process lost, or a sibling slot won, are in `group` (SlotGroup.lose):
    # a watched copy shows the winner's claim only once its event arrives; until the shard changes
    # (or LOST_CLAIM_SECONDS pass) trying it again would only lose again.
    # The current spread (SPREAD_SECONDS) and whether the last look ended with a lost claim.
    _spread: float = SPREAD_SECONDS
    _lost_last: bool = False
    # When this worker last saw each claim of its window renewed, on its own clock: zombies are
    # judged from it (`logic.leases`, "Whose clock").
    renewals: Renewals = field(init=False)
    # The persistent command's process between shards (spec.worker.persistent), ended at close().
    commands: CommandServer = field(init=False)
    # The campaign as of the slot's last look, and whether its persistent command was started
    # ahead of its first shard (`start_command_ahead`).
    _looked_at: Campaign | None = None
    _started_ahead: bool = False

    def __post_init__(self) -> None:
        if self.group is None:
            # Labelled as the operator labels its campaign metrics, so one dashboard variable fits both.
            self.group = SlotGroup(WorkerMetrics(f"{self.namespace}/{self.campaign_name}"))
        self.renewals = Renewals(self.clock.monotonic)
        self.commands = CommandServer(self.settings.work_dir, self.settings.keep_work_dir)
        if self.looks is None:
            self.looks = ReadLooks(self.kube, self.namespace, self.campaign_name)

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
                # Others are racing for the same shards: look again (there may be more to claim)
                # after a random part of the spread, not at once and not only at the next change.
                self.wait(self.rng.random() * self._spread)
                continue
            if self._more_coming or self.shared.busy:
                # A slot of a busy process waits on: the pod goes when all its slots are idle.
                idle_since = self.clock.monotonic()
            idle = self._idle_seconds()
            waited = self.clock.monotonic() - idle_since
            if waited >= idle:
                emit("exiting", reason=f"no claimable shard for {waited:.0f}s", shards=finished)
                return 0
            # Jitter so workers that went idle together do not poll in lockstep.
            self.wait_for_work(min(self.settings.poll_seconds * (0.5 + self.rng.random()), idle - waited))
        emit("exiting", reason="stop requested (SIGTERM)", shards=finished)
        return 0

    def close(self) -> None:
        assert self.looks is not None
        try:
            self.commands.close(self.settings.term_grace_seconds)
        finally:
            self.looks.close()

    def wait_for_work(self, seconds: float) -> None:
        """Until something may have made a shard claimable, or `seconds`. A watched change is
        followed by a pause of a random part of the spread, then the watched copy is asked whether
        a shard is Pending that this worker has not just lost (no request, no parse): when none is,
        someone else took the new shard during the pause, and the worker waits on without a look."""
        assert self.looks is not None
        deadline = self.clock.monotonic() + seconds
        while True:
            # On time without a change, the look comes all the same: it also judges zombies.
            if self.looks.wait(deadline - self.clock.monotonic(), self.stop) is not Wake.CHANGE:
                return
            if self.wait(self.rng.random() * self._spread) or self._may_claim():
                return

    def _may_claim(self) -> bool:
        """A Pending shard is in the watched copy that this worker did not just lose (or no copy)."""
        assert self.looks is not None
        pending = self.looks.pending(self.clock.now())
        if pending is None:
            return True
        return any(not self._lost_at(name, version) for name, version in pending.items())

    def _idle_seconds(self) -> float:
        if self.settings.idle_seconds is not None:
            return self.settings.idle_seconds
        return float(self._campaign_idle)

    def _step(self) -> Outcome | str | None:
        """One look for work: an Outcome when a shard was claimed and run, a reason to exit, or None.
        The look and the choice hold the process's claim lock (SlotGroup) until the chosen shard is
        reserved for this slot; its Lease create, the claim write and the run do not."""
        try:
            held = _Held(self.shared.claiming)
            try:
                found = self._claim_one(held)
            finally:
                held.release()
            if not isinstance(found, str) and self._looked_at is not None:
                self.start_command_ahead(self._looked_at)
            if not isinstance(found, _Won):
                return found
            run = ShardRun(self, found.campaign, found.claimed, found.cooling)
            outcome = run.execute()
            # Every claimed shard ends here, whichever way: the one place its outcome is counted.
            error_class = run.error_class if outcome is Outcome.FAILED else None
            self.metrics.observe_shard(run.shard.spec.shard_class, outcome, error_class)
            return outcome
        finally:
            if self._holding:
                self._holding = False
                self.shared.hold(False)

    def _claim_one(self, held: _Held) -> _Won | str | None:
        """Look, and claim a shard of the look: what was won, a reason to exit, or None. `held`: the
        claim lock, released once a shard is chosen and reserved."""
        assert self.looks is not None
        look = self._look(self.looks.look)
        decided = self._exit_reason(look)
        if decided is not None and (look is None or not look.fresh):
            # A watched copy may lag (two watches, each an event behind at most): exit only on a
            # fresh read that agrees (one more read of a gone campaign that was read already).
            look = self._look(lambda: read_look(self.kube, self.namespace, self.campaign_name))
            decided = self._exit_reason(look)
        if decided is not None or look is None:
            return decided
        campaign, shards = look.campaign, look.unfinished
        self._looked_at = campaign
        self._campaign_idle = campaign.spec.idle_seconds
        self._more_coming = uncut_shards(campaign, shards) > 0
        self.shared.keep_only({shard.name for shard in shards})
        silent = self._silences(shards)
        chosen = choose(campaign, shards, self.clock.now(), self.settings.claim_candidates, self.rng, silent)
        candidates = [candidate for candidate in chosen if not self._lost_recently(candidate.shard)]
        self._lost_last = False
        if not candidates:
            self.metrics.observe_claim(ClaimOutcome.NONE)
            return None
        if self.stop.is_set():
            return None
        # One candidate per look: a won claim runs, a lost race means the others on this look's
        # list are likely raced for too (the loop looks again after a pause, `_loop`).
        candidate = candidates[0]
        version = candidate.shard.metadata.resource_version or ""
        # Lost before (its Lease exists: read it before taking it), not counting the reservation.
        lost_before = self.shared.lost(candidate.shard.name) is not None
        # Reserved: from here the siblings pass this shard by at this version (SlotGroup), so the
        # lock goes now and their looks and Lease creates overlap this slot's Lease create.
        self.shared.lose(candidate.shard.name, version, self.clock.monotonic())
        held.release()
        context = ClaimContext(
            kube=self.kube,
            namespace=self.namespace,
            holder=self.holder,
            actor=self.actor,
            now=self.clock.now,
            items_of=lambda shard: self.items_of(campaign, shard),
            stored_of=lambda shard, items: self.stored_of(self.store_for(campaign), shard, items),
            store=lambda: self.store_for(campaign),
            seen=self.renewals,
            lost_before=lambda shard: lost_before,
            leased=self._taken,
        )
        try:
            claimed = claim(context, campaign, candidate)
        except BaseException:
            # Not lost to anyone (the Lease, if won, was let go): the next look tries it again,
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
        """Once per slot, after its first look: start the campaign's persistent command
        (spec.worker.persistent) before the slot's first shard needs it, so the process's start (an
        interpreter and its imports, seconds while a campaign's workers all start at once) overlaps
        the slot's wait for its first claim. Its environment is the one every shard's process gets
        (`served_process_env`), so the first shard takes it; a command that cannot start is left to
        that shard, which fails naming why."""
        if self._started_ahead:
            return
        self._started_ahead = True
        worker_spec = campaign.spec.worker
        if worker_spec.persistent is not True:
            return
        env = command_env(os.environ, campaign_variables(campaign, worker_spec), worker_spec.env_dict())
        try:
            self.commands.start_ahead(worker_spec.full_command(), served_process_env(env, SHARD_VARIABLES))
        except CommandFailure as failure:
            log.info("the persistent command did not start ahead; its first shard says why: %s", failure)

    def _silences(self, shards: Sequence[Shard]) -> dict[str, float]:
        """How long this worker has not seen each Running shard's claim renewed. Kept for every shard
        of the look (bounded by the window): a Pending shard's Lease judged at a claim stays timed."""
        self.renewals.keep_only([shard.lease_name for shard in shards])
        return {
            shard.name: shardview.claim_silence(self.renewals, shard, None)
            for shard in shards
            if shard.phase is ShardPhase.RUNNING
        }

    @staticmethod
    def _look(how: Callable[[], Look]) -> Look | None:
        """A look with only the shards the Campaign controls (a deleted incarnation's are not its)
        and has not folded; None when the campaign does not exist. Only the unfinished shards: what a
        look costs is bounded by the window, not the campaign.

        A shard whose index the campaign has folded is never worked on: it can only be a stale
        re-creation — a create an operator replica had in flight when it lost leadership, landing
        after the new leader folded and deleted that shard — which the leader deletes as a leftover
        (docs/architecture.md, "Leader election")."""
        try:
            look = how()
        except NotFound:
            return None
        mine = shardview.of_campaign(look.unfinished, look.campaign)
        return Look(look.campaign, ledger.unfolded(mine, look.campaign.current_status.folded), look.fresh)

    def _exit_reason(self, look: Look | None) -> str | None:
        """Why this worker should exit, judged on `look` (None: the campaign does not exist)."""
        if look is None:
            return f"campaign {self.namespace}/{self.campaign_name} does not exist"
        started_for = self.settings.campaign_uid
        if started_for and look.campaign.metadata.uid != started_for:
            return (
                f"campaign {self.namespace}/{self.campaign_name} was deleted and applied again "
                f"(uid {look.campaign.metadata.uid}, this worker's was {started_for})"
            )
        return stop_reason(look.campaign, look.unfinished)

    def _lost_recently(self, shard: Shard) -> bool:
        """This process lost (or a sibling slot won) the claim of `shard` as it is now, a moment ago:
        the winner's claim has not reached the copy yet. (Bounded by the window: pruned to the
        looked-at shards, `SlotGroup.keep_only`.)"""
        return self._lost_at(shard.name, shard.metadata.resource_version or "")

    def _lost_at(self, name: str, version: str) -> bool:
        lost = self.shared.lost(name)
        if lost is None:
            return False
        lost_version, at = lost
        return lost_version == version and self.clock.monotonic() - at <= LOST_CLAIM_SECONDS

    # --- items and stored results ----------------------------------------------------------------

    def items_of(self, campaign: Campaign, shard: Shard) -> list[Item]:
        """The shard's items: inline, or its slice of the campaign's itemsFrom ConfigMap."""
        if shard.spec.items_left_out:
            # A lean listing's shard reads as having no items: running it would compute nothing.
            raise ValueError(f"{shard.name}: parsed without its items; claim takes Shard.with_items()")
        if shard.spec.items is not None:
            return list(shard.spec.items)
        source = campaign.spec.items_from
        # Shards carry their items since they are cut; only Shards of old versions point at a
        # ConfigMap slice (never at an object: those Shards always carry theirs).
        if (
            shard.spec.item_range is None
            or source is None
            or source.config_map_name is None
            or not source.key
        ):
            return []
        cache_key = (campaign.metadata.uid or "", source.config_map_name, source.key)
        if cache_key not in self._items_cache:
            configmap = self.kube.get(CONFIGMAPS, self.namespace, source.config_map_name)
            text = (configmap.get("data") or {}).get(source.key, "")
            self._items_cache[cache_key] = source.parse_items(text)
        every = self._items_cache[cache_key]
        return every[shard.spec.item_range.start : shard.spec.item_range.end]

    def store_for(self, campaign: Campaign) -> ResultStore:
        """The result store the campaign's status names (opened once per location)."""
        location: ResultStoreStatus = location_of(campaign)
        return self.shared.store(
            location.model_dump_json(),
            lambda: open_store(self.kube, self.namespace, location, self.settings.result_max_bytes),
        )

    def stored_of(self, store: ResultStore, shard: Shard, items: Sequence[Item]) -> dict[str, ItemRecord]:
        found, corrupt = store.read_items(shard.spec.idempotency_key, [item_subkey(i) for i in items])
        if corrupt:
            log.warning(
                "%s: %d stored item result(s) failed verification; recomputing them", shard.name, len(corrupt)
            )
        return found


def run_slots(slots: Sequence[Worker]) -> int:
    """Run each slot's loop in a thread of its own until all have exited; slot 0 runs in the calling
    thread, so a worker of one slot runs as it always did. The exit code: 1 when a slot ended on a
    fatal error (which also stops the others, gracefully: their shards are released), else 0. A
    slot's commands are started and ended by its own thread (the parent-death signal follows the
    thread that started a process: `runner.spawn`)."""
    codes = [0] * len(slots)

    def run(index: int) -> None:
        slot = slots[index]
        try:
            codes[index] = slot.run()
        except BaseException:
            log.exception("slot %d of %s failed", index, slot.holder)
            codes[index] = 1
        if codes[index] != 0:
            slot.stop.set()

    threads = [
        threading.Thread(target=run, args=(index,), name=f"slot-{index}", daemon=True)
        for index in range(1, len(slots))
    ]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    return max(codes, default=0)


@dataclass
class ShardRun:
    """One claimed shard, from claim to outcome. Holds the latest shard object (its
    resourceVersion is the precondition of our next write) and the Lease claim."""

    worker: Worker
    campaign: Campaign
    claimed: Claimed
    # Per-source cooldowns known at the claim; a heartbeat of an LLM shard refreshes its source's.
    cooldowns: Mapping[str, SourceCooldown] = field(default_factory=dict)
    shard: Shard = field(init=False)
    lease: leases.Claim = field(init=False)
    stored: dict[str, ItemRecord] = field(init=False)
    fresh: dict[str, ItemRecord] = field(default_factory=dict)
    attempt_cost: float = 0.0
    attempt_tokens: TokenCounts = NO_TOKENS
    # How the command ended, once known (shardops_worker_command_duration_seconds); None: not yet.
    command_outcome: CommandOutcome | None = None
    # The class of the failure this run recorded (fail()), for shardops_worker_shards_total.
    error_class: ErrorClass | None = None
    # The shard result this run stored, once it is stored: from then on the shard is finished.
    stored_result: StoredResult | None = None

    def __post_init__(self) -> None:
        self.shard = self.claimed.shard
        self.lease = self.claimed.lease
        self.stored = dict(self.claimed.stored)
        self.items = list(self.claimed.items)
        self.keys = [item_subkey(item) for item in self.items]
        self.base_cost = self.shard.current_status.cost
        self.base_tokens = self.shard.current_status.tokens
        self.attempt = max(self.shard.current_status.attempt, 1)
        self.key = self.shard.spec.idempotency_key
        self.kube = self.worker.kube
        self.settings = self.worker.settings
        self.clock = self.worker.clock
        self.store = self.worker.store_for(self.campaign)
        self.cooldown_file: Path | None = None

    # --- bookkeeping ------------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        return self.worker.namespace

    @property
    def name(self) -> str:
        return self.shard.name

    def known(self) -> dict[str, ItemRecord]:
        return {**self.stored, **self.fresh}

    def progress(self) -> Progress:
        known = self.known()
        return Progress(done=sum(1 for key in self.keys if key in known), total=len(self.keys))

    def cost(self) -> float:
        # Cumulative over the shard's attempts, so the operator can add shard costs up as they are.
        return self.base_cost + self.attempt_cost

    def tokens(self) -> TokenCounts | None:
        """Cumulative over the attempts like cost; None while no attempt reported any."""
        if self.base_tokens is None and not self.attempt_tokens.used:
            return None
        return (self.base_tokens or NO_TOKENS) + self.attempt_tokens

    def remaining(self) -> list[WorkItem]:
        known = self.known()
        seen: set[str] = set()
        work: list[WorkItem] = []
        for index, (key, item) in enumerate(zip(self.keys, self.items, strict=True)):
            if key in known or key in seen:
                continue
            seen.add(key)
            work.append(WorkItem(key, index, item))
        return work

    def absorb(self, lines: Sequence[ResultLine]) -> None:
        for line in lines:
            if line.key not in self.known():
                self.fresh[line.key] = ItemRecord(line.result, line.cost)
            self.attempt_cost += line.cost
            self.attempt_tokens += line.tokens
        cap = self.campaign.spec.budget.max_per_shard if self.campaign.spec.budget else None
        if cap is not None and self.cost() > cap:
            raise CommandFailure(
                ErrorClass.OVER_BUDGET,
                f"shard cost {self.cost():g} passed the per-shard cap spec.budget.maxPerShard {cap:g} "
                f"after {self.progress().done} of {len(self.keys)} item(s); the command was stopped",
            )

    # --- writes as the holder ---------------------------------------------------------------------

    def renew(self) -> None:
        self.lease = heartbeat.renew(self.kube, self.lease, self.clock.now())

    def flush(self) -> int:
        """Store the item results read since the last flush (only new ones)."""
        if not self.fresh:
            return 0
        written = self.store.save_items(
            self.key, self.campaign.name, self.fresh, shard=self.name, token=self.lease.fencing_token
        )
        self.stored.update(self.fresh)
        self.fresh = {}
        return written

    def flush_if_possible(self) -> None:
        """Before handing the shard back: keep what can be kept, but never let the store stop the
        hand-back. Results not stored are computed again by the next attempt."""
        try:
            self.flush()
        except ResultTooLarge:
            # The partial results alone are over the cap: keep nothing rather than part of them.
            self.fresh = {}
        except TRANSIENT_ERRORS as error:
            log.warning("%s: could not store %d item result(s): %s", self.name, len(self.fresh), error)
            self.fresh = {}

    def heartbeat(self) -> None:
        self.renew()
        self.flush()
        patch = heartbeat.heartbeat_patch(
            self.attempt, self.progress(), self.cost(), self.clock.now(), self.lease.until, self.tokens()
        )
        self.shard = heartbeat.write_as_holder(
            self.kube,
            self.shard,
            self.worker.holder,
            self.lease.fencing_token,
            lambda shard: heartbeat.patch_heartbeat(self.kube, shard, patch),
        )
        self.refresh_cooldown()

    def refresh_cooldown(self) -> None:
        """Mid-shard, another worker's 429 reaches this one through the Campaign's
        status.sourceCooldowns (the operator records it): one GET per heartbeat, only for a shard whose
        command reads the cooldown file. Trouble reading it is not the heartbeat's: the next one retries."""
        if self.cooldown_file is None:
            return
        try:
            campaign = Campaign.parse_items_counted(
                self.kube.get(CAMPAIGNS, self.namespace, self.campaign.name)
            )
        except TRANSIENT_ERRORS as error:
            # NotFound is an ApiError: a deleted campaign ends the shard by other ways.
            log.warning("%s: could not read the campaign's source cooldowns: %s", self.name, error)
            return
        self.cooldowns = cooldowns.later(self.cooldowns, cooldowns.recorded(campaign, self.clock.now()))
        try:
            self.write_cooldown()
        except OSError as error:
            log.warning("%s: could not write the cooldown file: %s", self.name, error)

    def write_cooldown(self) -> None:
        """The cooldown of the shard's source as {source, until (epoch seconds), shard}, or {} for none."""
        if self.cooldown_file is None:
            return
        found = self.cooldowns.get(self.claimed.source or "")
        body = (
            {"source": found.source, "until": found.until.timestamp(), "shard": found.shard}
            if found is not None
            else {}
        )
        temporary = self.cooldown_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(body), encoding="utf-8")
        temporary.replace(self.cooldown_file)

    def transition(self, request: TransitionRequest) -> None:
        now = self.clock.now()
        self.shard = heartbeat.write_as_holder(
            self.kube,
            self.shard,
            self.worker.holder,
            self.lease.fencing_token,
            lambda shard: apply_transition(self.kube, shard, request, self.worker.actor, now),
        )

    def _leaving(self) -> dict[str, Any]:
        """Fields every exit from Running clears or settles: the claim goes, progress and cost stay."""
        return {
            "owner": None,
            "lease_until": None,
            "fencing_token": None,
            "progress": self.progress(),
            "cost": self.cost(),
            "tokens": self.tokens(),
        }

    def release_lease(self) -> None:
        if not leases.release(self.kube, self.lease):
            log.warning("%s: the Lease was no longer ours when releasing it", self.name)

    # --- the run ----------------------------------------------------------------------------------

    def execute(self) -> Outcome:
        try:
            try:
                return self._execute()
            except (Fenced, Forbidden):
                raise
            except Exception as error:
                # Trouble of our own or of the API mid-shard: record it as a failed attempt (retryable,
                # bounded by maxAttempts) if the API lets us, so the shard does not wait out its lease.
                log.exception("%s: attempt %d broke off", self.name, self.attempt)
                return self._abandon(error)
        except Fenced as fenced:
            self.worker.metrics.observe_fenced(fenced.reason)
            emit(
                "fenced",
                shard=self.name,
                attempt=self.attempt,
                token=self.lease.fencing_token,
                discarded=len(self.fresh),
                reason=str(fenced),
            )
            return Outcome.FENCED

    def _abandon(self, error: Exception) -> Outcome:
        try:
            if isinstance(error, StoreUnavailable):
                return self.fail(ErrorClass.UNAVAILABLE, f"result store: {error}", self.claimed.source)
            return self.fail(
                ErrorClass.UNKNOWN, f"the worker broke off the attempt: {error!r}", self.claimed.source
            )
        except (Fenced, Forbidden):
            raise
        except Exception as again:
            # Nothing could be written: the Lease runs out and the shard is reclaimed as a zombie.
            emit(
                "abandoned",
                shard=self.name,
                error=repr(error),
                then=repr(again),
                lease_until=self.lease.until,
            )
            return Outcome.ABANDONED

    def _execute(self) -> Outcome:
        try:
            existing = self.with_store("reading the stored result", lambda: self.store.read_result(self.key))
        except StoreCorrupt as corrupt:
            log.warning("%s: stored result does not verify (%s); recomputing", self.name, corrupt)
            existing = None
        if existing is not None:
            return self.complete(existing, reused=True)
        if self.worker.stop.is_set():
            return self.release()
        work = self.remaining()
        # A finalize shard has no items: its command runs once, with an empty items file.
        if not work and not self.finalize:
            return self.complete(None, reused=False)
        return self.run_command(work)

    @property
    def finalize(self) -> bool:
        return self.shard.spec.shard_class is ShardClass.FINALIZE

    @property
    def persistent(self) -> bool:
        """Run by the worker's persistent command: spec.worker's choice, for work shards only."""
        return not self.finalize and self.campaign.spec.worker.persistent is True

    def write_campaign_results(self, path: Path) -> tuple[ErrorClass, str] | None:
        """The finalize shard's input: every finished item of the campaign, one JSON line each in
        item order (what `kubectl campaign results` prints), written before its command starts.
        Returns why it could not be written, or None. A whole-campaign read, once per campaign (the
        finalize shard runs after every work shard); the claim is renewed at every heartbeat
        interval meanwhile, since reading many stored results can outlast a lease."""
        # The Shards are listed before the Campaign is read: a fold records its shards in the status
        # before it deletes them, so a shard missing from the list is in the status read after it.
        listed = list_shards(self.kube, self.namespace, self.campaign.name)
        campaign = Campaign.parse(self.kube.get(CAMPAIGNS, self.namespace, self.campaign.name))
        listed = shardview.of_campaign(listed, campaign)
        folded = campaign.current_status.folded
        s3 = self.store if isinstance(self.store, S3Store) else None
        interval = campaign.spec.effective_heartbeat_seconds
        next_renewal = self.clock.monotonic() + interval
        lines = 0
        try:
            work = results.work_shards(ledger.unfolded(listed, folded))
            finished = results.finished_shards(
                campaign.name, work, folded, results.ledger_of(self.store, campaign)
            )
            every_item = lambda: campaign_items(self.kube, campaign, s3)  # noqa: E731 - only if needed
            with path.open("w", encoding="utf-8") as out:
                for _, line in results.done_lines(results.read_verified(self.store), finished, every_item):
                    out.write(results.json_line(line) + "\n")
                    lines += 1
                    if self.clock.monotonic() >= next_renewal:
                        self.renew()
                        next_renewal = self.clock.monotonic() + interval
        except results.ResultsMismatch as mismatch:
            return ErrorClass.UNKNOWN, f"the campaign's results for the finalize shard: {mismatch}"
        except ItemsChanged as changed:
            return ErrorClass.INVALID_INPUT, f"the campaign's items for the finalize shard: {changed.message}"
        except (ItemsOverLimit, NotJsonlText) as refused:  # the operator refuses them before any shard
            return ErrorClass.INVALID_INPUT, f"the campaign's items for the finalize shard: {refused}"
        except ItemsUnavailable as problem:
            return ErrorClass.NOT_FOUND, f"the campaign's items for the finalize shard: {problem.message}"
        except OSError as error:
            return ErrorClass.UNKNOWN, f"cannot write the campaign's results file: {error}"
        emit("campaign-results-written", shard=self.name, lines=lines, shards=len(finished))
        return None

    def run_command(self, work: list[WorkItem]) -> Outcome:
        worker_spec = (self.finalize and self.campaign.spec.finalize) or self.campaign.spec.worker
        try:
            files = AttemptFiles.create(work, f"{self.name}-a{self.attempt}-", self.settings.work_dir)
        except OSError as error:
            return self.fail(
                ErrorClass.UNKNOWN, f"cannot write the attempt's files: {error}", self.claimed.source
            )
        # The protocol variables whose values are this shard's own (SHARD_VARIABLES, and the
        # optional ones below); a persistent command gets them with each shard's request, the
        # campaign's at its start.
        values = (
            str(files.items),
            str(files.results),
            str(files.error),
            self.claimed.source or "",
            self.name,
            str(self.attempt),
            self.key,
        )
        of_shard = dict(zip(SHARD_VARIABLES, values, strict=True))
        of_campaign = campaign_variables(self.campaign, worker_spec)
        if self.finalize:
            problem = self.write_campaign_results(files.campaign_results)
            if problem is not None:
                files.remove()
                return self.fail(problem[0], problem[1], self.claimed.source)
            of_shard["SHARDOPS_CAMPAIGN_RESULTS_FILE"] = str(files.campaign_results)
        if worker_spec.llm is not None and self.claimed.source is not None:
            # The built-in LLM worker reads its source's cooldown from this file before each request.
            self.cooldown_file = files.directory / COOLDOWN_FILE
            self.write_cooldown()
            of_shard[COOLDOWN_FILE_ENV] = str(self.cooldown_file)
        argv = worker_spec.full_command()
        env = command_env(os.environ, {**of_campaign, **of_shard}, worker_spec.env_dict())
        command: ShardCommand
        if self.persistent:
            command = ServedCommand(self.worker.commands, argv, env, frozenset(of_shard), self.name)
        else:
            command = Command(argv, env, files.directory)
        reader = ResultsReader(files.results, [w.key for w in work], self.store.max_bytes)
        try:
            command.start()
            self.command_started(command, len(work))
            return self.supervise(command, reader, files, len(work))
        except CommandFailure as failure:
            command.kill()
            self.command_outcome = self.command_outcome or CommandOutcome.FAILED
            return self.fail(failure.error_class, failure.message, self.claimed.source)
        finally:
            command.kill()
            seconds = command.seconds()
            # A command that never started has no run time (its shard counts as failed, by class).
            if seconds is not None:
                outcome = self.command_outcome or CommandOutcome.ERROR
                self.worker.metrics.observe_command(self.shard.spec.shard_class, outcome, seconds)
            if not self.settings.keep_work_dir:
                files.remove()

    def command_started(self, command: ShardCommand, items: int) -> None:
        """Log the start of the shard's command and count a process started for it (a persistent
        command's process is started for the first shard it serves, or when it was replaced)."""
        if command.new_process:
            mode = CommandMode.PERSISTENT if self.persistent else CommandMode.PER_SHARD
            self.worker.metrics.observe_command_start(mode)
        served = (
            {"persistent": True, "new_process": command.new_process, "replaced": command.replaced}
            if isinstance(command, ServedCommand)
            else {}
        )
        emit("command-started", shard=self.name, pid=command.pid, items=items, attempt=self.attempt, **served)

    def supervise(
        self, command: ShardCommand, reader: ResultsReader, files: AttemptFiles, count: int
    ) -> Outcome:
        interval = self.campaign.spec.effective_heartbeat_seconds
        next_beat = self.clock.monotonic() + interval
        shutdown = False
        while True:
            self.absorb(reader.poll())
            if command.poll() is not None:
                break
            if self.worker.stop.is_set():
                shutdown = True
                emit(
                    "stopping-command",
                    shard=self.name,
                    pid=command.pid,
                    grace=self.settings.term_grace_seconds,
                )
                command.terminate(self.settings.term_grace_seconds)
                break
            if self.clock.monotonic() >= next_beat:
                next_beat = self._beat(command, interval)
            # A tick, cut short by the command's end (its exit, its answer): a shard's slot goes on
            # to its next claim at once, not up to a tick later.
            command.wait(self.settings.tick_seconds)
        code = command.poll()
        # A last line cut short is an error only from a command that claims success (exit 0); one that
        # crashed or was stopped simply did not finish that item.
        self.absorb(reader.finish(tolerate_partial=command.signalled or code != 0))
        missing = len(self.remaining())
        if code == 0 and not missing:
            self.command_outcome = CommandOutcome.SUCCEEDED
        else:
            self.command_outcome = CommandOutcome.STOPPED if shutdown else CommandOutcome.FAILED
        emit(
            "command-exited",
            shard=self.name,
            code=code,
            results=count - missing,
            missing=missing,
            seconds=command.seconds(),
        )
        if shutdown and (code != 0 or missing):
            return self.release()
        if code == 0:
            if missing:
                raise CommandFailure(
                    ErrorClass.BAD_OUTPUT,
                    f"command exited 0 but wrote results for {count - missing} of {count} item(s); "
                    "exit 0 means every item has a result line",
                )
            return self.complete(None, reused=False)
        classified = classify_failure(code or 0, read_error_file(files.error), self.claimed.source)
        assert classified is not None  # code != 0
        return self.fail(
            classified.error_class, classified.message, classified.source, classified.retry_after_seconds
        )

    def _beat(self, command: ShardCommand, interval: float) -> float:
        """Heartbeat; returns when the next one is due. Fenced propagates after killing the command."""
        metrics = self.worker.metrics
        try:
            self.heartbeat()
        except Fenced:
            metrics.observe_heartbeat(HeartbeatOutcome.FENCED)
            self.command_outcome = CommandOutcome.FENCED
            command.kill()
            raise
        except ResultTooLarge as too_large:
            raise CommandFailure(ErrorClass.RESULT_TOO_LARGE, str(too_large)) from None
        except TRANSIENT_ERRORS as error:
            metrics.observe_heartbeat(HeartbeatOutcome.FAILED)
            if self.clock.now() >= self.lease.until:
                # We could not renew before the lease ran out: someone may hold it now. Stop, write
                # nothing; if nobody took over, the next claim resumes from our last flush.
                self.command_outcome = CommandOutcome.FENCED
                command.kill()
                raise Fenced(
                    f"lease ran out while the API server was unreachable ({error})", FenceReason.EXPIRED
                ) from error
            log.warning("%s: heartbeat failed, retrying: %s", self.name, error)
            return self.clock.monotonic() + _HEARTBEAT_RETRY_SECONDS
        metrics.observe_heartbeat(HeartbeatOutcome.OK)
        return self.clock.monotonic() + interval

    # --- endings ----------------------------------------------------------------------------------

    def with_store(self, what: str, call: Callable[[], T]) -> T:
        """`call`, retried while the store is unreachable, keeping the claim (renewing the Lease)
        for up to SHARDOPS_STORE_RETRY_SECONDS; then StoreUnavailable propagates."""
        deadline = self.clock.monotonic() + self.settings.store_retry_seconds
        while True:
            try:
                return call()
            except StoreUnavailable as error:
                if self.clock.monotonic() >= deadline or self.worker.stop.is_set():
                    raise
                log.warning("%s: %s failed, retrying: %s", self.name, what, error)
            self.worker.wait(self.settings.poll_seconds)
            self.renew()

    def renew_before_completing(self) -> None:
        """Renew the Lease on the way to Done where it matters.

        Neither store needs it to fence the result: a stale holder's result never becomes one (each
        claim stores its own, and the commit follows the fenced Done write, which re-checks owner and
        token on the shard). S3 store: only when less than half the lease is left, so the lease does
        not run out meanwhile; two fewer writes per shard. ConfigMap store: always, first — the claim
        is proven before the final flush into the key's items ConfigMap, which every claim of the
        key adds to and whose entries are never replaced."""
        if self.store.type is StoreType.S3:
            left = self.lease.until - self.clock.now()
            if left > dt.timedelta(seconds=self.campaign.spec.lease_seconds / 2):
                return
        self.renew()

    def complete(self, existing: StoredResult | None, reused: bool) -> Outcome:
        """Done, in the order of docs/architecture.md ("Completion"); API trouble on the way is
        retried while the lease lasts (`while_lease_lasts`), never charged as an attempt."""
        if existing is None:
            try:
                existing, reused = self.while_lease_lasts("storing the result", self.store_shard_result)
            except ResultTooLarge as too_large:
                return self.fail(ErrorClass.RESULT_TOO_LARGE, str(too_large), self.claimed.source)
            except StoreUnavailable as unavailable:
                return self.fail(ErrorClass.UNAVAILABLE, f"result store: {unavailable}", self.claimed.source)
            self.stored_result = existing
        verb = "reused the stored result" if reused else "stored the result"
        message = f"{verb} {existing.name} ({existing.bytes} bytes, {existing.fingerprint})"
        updates = {
            **self._leaving(),
            "progress": Progress(done=len(self.keys), total=len(self.keys)),
            "result": ShardResult(ref=existing.name, fingerprint=existing.fingerprint, bytes=existing.bytes),
            "last_heartbeat": self.clock.now(),
        }
        done = TransitionRequest(Action.COMPLETE, message, updates=updates)

        def write_done(retrying: bool) -> None:
            # Re-check holder and token right before the Done write (and extend the lease for it).
            self.prove_claim(retrying)
            self.transition(done)

        try:
            self.while_lease_lasts("the Done write", write_done)
        except Fenced:
            if not self.folded_after_our_done_write():
                raise
        # Nobody else can hold the shard until after this moment: the Lease is ours until it runs out.
        ended = time.time()
        # The Lease is not released: Done is terminal, so nobody claims the shard again, and the
        # Lease goes with its Shard (owner reference) when the shard is folded. Two requests fewer
        # per shard (a GET and a PATCH).
        if not reused:
            self.commit(existing)
        emit(
            "completed",
            shard=self.name,
            attempt=self.attempt,
            token=self.lease.fencing_token,
            reused=reused,
            ref=existing.name,
            bytes=existing.bytes,
            cost=self.cost(),
            at=ended,
        )
        return Outcome.REUSED if reused else Outcome.DONE

    def folded_after_our_done_write(self) -> bool:
        """Whether a Done write that ended fenced was applied after all, its shard folded since.

        A Done write whose answer was lost is recognised by re-reading the shard (or, on a retry,
        renewing the Lease first); but the operator folds a Done shard and deletes its Lease and
        then it within moments, so the retry's renewal may find no Lease and the re-read no shard.
        While our Lease has not run out nobody else could have completed the shard: found Done (its
        Lease already gone, the Shard next), our write was applied. And a Shard of a campaign that
        still stands (same uid) is deleted only when folded, which only a Done shard is: gone, our
        write was applied too. (A deleted campaign also deletes its shards: that stays a fencing,
        and nothing is committed for its retention to miss.) Only shards of an S3 store are folded.
        At most two GETs, only on this path."""
        if self.store.type is not StoreType.S3 or self.clock.now() >= self.lease.until:
            return False
        try:
            found = self.kube.get(SHARDS, self.namespace, self.name)
            if (found.get("metadata") or {}).get("uid") == self.shard.metadata.uid:
                if Shard.parse_items_counted(found).phase is not ShardPhase.DONE:
                    return False  # still there and not Done: the fencing stands
                log.info("%s: the Done write's answer was lost; the shard is Done, being folded", self.name)
                return True
        except NotFound:
            pass
        except TRANSIENT_ERRORS as error:
            log.warning("%s: fenced at the Done write; the shard could not be read: %s", self.name, error)
            return False
        try:
            campaign = self.kube.get(CAMPAIGNS, self.namespace, self.campaign.name)
        except TRANSIENT_ERRORS as error:
            log.warning("%s: gone after the Done write; the campaign could not be read: %s", self.name, error)
            return False
        if (campaign.get("metadata") or {}).get("uid") != self.campaign.metadata.uid:
            return False
        log.info("%s: the Done write's answer was lost and the shard is folded: it was applied", self.name)
        return True

    def while_lease_lasts(self, what: str, call: Callable[[bool], T]) -> T:
        """`call(retrying)` (a step of the way to Done), retried on API trouble while the lease lasts:
        a result that is stored must reach its shard, and a transient error is no reason to charge an
        attempt. Once the lease has run out someone else may hold the shard: Fenced, nothing more is
        written, and whoever judges the zombie finds the stored result (`store.finished`). The result
        store's own outages are `with_store`'s (StoreUnavailable propagates)."""
        retrying = False
        while True:
            try:
                return call(retrying)
            except StoreUnavailable:
                raise
            except TRANSIENT_ERRORS as error:
                if self.clock.now() >= self.lease.until:
                    raise Fenced(
                        f"lease ran out while {what} kept failing ({error})", FenceReason.EXPIRED
                    ) from error
                log.warning("%s: %s failed, retrying while the lease lasts: %s", self.name, what, error)
            # Not worker.wait: a shutdown does not cut this short, the lease bounds it.
            time.sleep(self.settings.poll_seconds)
            retrying = True

    def prove_claim(self, retrying: bool) -> None:
        """Renew on the way to Done: where it matters on a first try, always on a retry (the lease
        may be short after API trouble)."""
        if retrying:
            self.renew()
        else:
            self.renew_before_completing()

    def store_shard_result(self, retrying: bool) -> tuple[StoredResult, bool]:
        """Store the item results (ConfigMap store) and the shard result, the claim proven first."""
        self.prove_claim(retrying)
        if self.store.type is not StoreType.S3:
            # S3: the result holds every item; a failure to store it flushes them (fail()).
            self.with_store("storing item results", self.flush)
        known = self.known()
        entries = [(i, key, known[key].result) for i, key in enumerate(self.keys)]
        text = encode_result(self.key, entries, {key: known[key].cost for key in self.keys})
        meta = ResultMeta(
            self.campaign.name, self.name, self.worker.holder, self.attempt, self.lease.fencing_token
        )
        return self.with_store(
            "storing the result", lambda: self.store.store_result(self.key, text, meta, len(entries))
        )

    def verified_result(self) -> StoredResult | None:
        """The shard's result if it is stored and verifies: the one this run stored, else the key's
        (one read). Trouble reading it counts as none."""
        if self.stored_result is not None:
            return self.stored_result
        try:
            return self.store.read_result(self.key)
        except StoreCorrupt:
            return None
        except TRANSIENT_ERRORS as error:
            log.warning("%s: could not look for a stored result before failing: %s", self.name, error)
            return None

    def commit(self, stored: StoredResult) -> None:
        """Make the result the key's result for reuse. Only after the fenced Done write: a claim whose
        Done write was refused never gets here, so its result object never becomes the key's."""
        commit_for_reuse(self.store, self.shard, stored)

    def fail(
        self, error_class: ErrorClass, message: str, source: str | None, retry_after: float | None = None
    ) -> Outcome:
        stored = self.verified_result()
        if stored is not None:
            # A shard whose result verifies is never Failed or Blocked: it is finished.
            log.warning(
                "%s: %s: %s, but its result %s verifies; completing",
                self.name,
                error_class,
                message,
                stored.name,
            )
            return self.complete(stored, reused=stored is not self.stored_result)
        self.error_class = error_class
        self.renew()
        self.flush_if_possible()
        decision = next_phase_after_failure(error_class, self.attempt, self.campaign.spec.max_attempts)
        now = self.clock.now()
        updates: dict[str, Any] = {
            **self._leaving(),
            "last_error": ShardError(
                error_class=error_class,
                source=source,
                message=message,
                at=now,
                # From now, not from when the answer came: never sooner than the upstream asked.
                retry_at=(
                    now + dt.timedelta(seconds=retry_after)
                    if retry_after is not None and error_class is ErrorClass.RATE_LIMITED and source
                    else None
                ),
            ),
        }
        if decision.backoff:
            backoff = self.campaign.spec.backoff
            updates["not_before"] = retry_not_before(
                now,
                self.attempt,
                backoff.base_seconds,
                backoff.cap_seconds,
                self.worker.rng.random(),
                retry_after,
            )
        self.transition(
            TransitionRequest(decision.action, f"{error_class}: {message} ({decision.reason})", updates)
        )
        ended = time.time()
        self.release_lease()
        emit(
            "failed",
            shard=self.name,
            attempt=self.attempt,
            error_class=str(error_class),
            phase=str(decision.phase),
            message=message,
            at=ended,
        )
        return Outcome.FAILED

    def release(self) -> Outcome:
        self.renew()
        self.flush_if_possible()
        done = self.progress()
        message = f"released by {self.worker.holder} on shutdown with {done.done}/{done.total} item(s) stored"
        self.transition(TransitionRequest(Action.RELEASE, message, updates=self._leaving()))
        ended = time.time()
        self.release_lease()
        emit("released", shard=self.name, attempt=self.attempt, stored=done.done, total=done.total, at=ended)
        return Outcome.RELEASED
