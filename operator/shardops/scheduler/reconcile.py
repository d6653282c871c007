"""The campaign reconcile: observe the campaign's objects, decide with `logic/`, act through `k8s/`.

One pass:
  1. read the Campaign; parse and validate it and its items (a bad one: Ready=False, nothing created);
  2. observe its Shards, worker Jobs and their pods;
  3. act on recorded requests (retry of Blocked/Failed shards) and sweep the leases of Running shards
     (zombies back to Pending, stalls reported or revoked);
  4. plan (`logic.planner.plan_dispatch`) and carry the plan out: pause/resume, materialize shards
     within the backlog bound, the finalize shard once the work is done;
  5. fold the new shard history (this pass's included) into the per-source breakers, plan again on
     what now exists, and keep the worker Jobs the plan wants;
  6. write the status if it changed, then announce the conditions that turned.

Every shard transition goes through `k8s.shards.apply_transition` (resourceVersion precondition +
Event). A Conflict on one shard means it moved meanwhile: it is left for the next pass.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from shardops import store
from shardops.api.campaign import (
    Campaign,
    CampaignStatus,
    FoldedShards,
    ItemsObject,
    ResultStoreStatus,
    resolve_result_store,
)
from shardops.api.common import JSON, Condition, Item
from shardops.api.enums import (
    BreakerState,
    CampaignPhase,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    ErrorClass,
    ShardClass,
    ShardPhase,
    StoreType,
)
from shardops.api.names import PLANNED_FROM_ANNOTATION
from shardops.api.shard import Shard, ShardError
from shardops.clock import utcnow
from shardops.k8s import campaigns, events, jobs, leases
from shardops.k8s.api import (
    CAMPAIGNS,
    LEASES,
    SHARDS,
    AlreadyExists,
    ApiError,
    Conflict,
    Kube,
    NotFound,
    WriteRefused,
)
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition, list_shards
from shardops.logic import conditions
from shardops.logic import retry as retry_logic
from shardops.logic.aggregate import aggregate
from shardops.logic.breaker import SourceBreaker, effective
from shardops.logic.budget import BudgetGate, allows
from shardops.logic.conditions import DesiredCondition
from shardops.logic.leases import LeaseVerdict, Renewals, classify_lease, lease_action
from shardops.logic.planner import DispatchPlan, LimitReason, plan_dispatch
from shardops.logic.shard_items import ShardItemsTooLarge, check_shard_items
from shardops.logic.shardview import ItemProgress
from shardops.logic.transitions import Action
from shardops.scheduler import builders, failpoints
from shardops.scheduler.metrics import BREAKER_VALUES, Metrics
from shardops.scheduler.retention import Retention
from shardops.scheduler.settings import REPORTING_CONTROLLER, OperatorSettings
from shardops.state import breakers, cooldowns, error_threshold, history, ledger, observe, shardview, workers
from shardops.store import ResultStore
from shardops.store.finished import commit_for_reuse, commit_recorded, completion, stored_result_of
from shardops.store.items import StreamedItems, object_items
from shardops.store.records import StoredResult, StoreUnavailable
from shardops.store.s3 import NotJsonlText, S3Store

log = logging.getLogger(__name__)

CONFLICT_ROUNDS = 3
# Done shards one pass folds at most (one ledger segment, one status write); more wait a pass.
MAX_FOLD = 500
# The operator acts on a retry request (the CLI records the request itself as RetryRequested).
RETRY_STARTED = "RetryStarted"


@dataclass
class _Progress:
    """When a running shard's progress last rose, as this process saw it (for stall detection)."""

    attempt: int
    done: int
    changed_at: dt.datetime
    reported: bool = False


@dataclass
class _Memory:
    """What one campaign's reconciles remember between passes. Losing it (restart, failover) only
    delays stall and zombie detection (by up to a stall window, a lease duration). Which history
    entries are folded is not here: the status says it (status.historyFolded), per shard, and a new
    leader reads it there."""

    items_key: tuple[str, int, str] | None = None
    items: Sequence[Item] = field(default_factory=list)
    progress: dict[str, _Progress] = field(default_factory=dict)
    # When each Running shard's claim was last seen renewed, on this process's clock: expiry is
    # judged from it, never from the holder's timestamps (`logic.leases`, "Whose clock").
    renewals: Renewals = field(default_factory=lambda: Renewals(time.monotonic))
    shard_seen: dict[str, tuple[str, float]] = field(default_factory=dict)
    # Coalescing of concurrent requests: one pass at a time, and one more if asked meanwhile.
    running: bool = False
    again: bool = False
    last_started: float = 0.0


@dataclass
class _Observed:
    body: JSON
    campaign: Campaign
    # Inline items, a ConfigMap's, or an object's read as a stream (store.items.StreamedItems).
    items: Sequence[Item]
    shards: dict[str, Shard]
    jobs: list[JSON]
    pods: list[JSON]
    # Listed Shards already folded into the ledger (a pass stopped before deleting them): deleted,
    # never counted again.
    leftovers: list[Shard] = field(default_factory=list)


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        metrics: Metrics,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        renewing: Callable[[], bool] = lambda: True,
        clock: Callable[[], dt.datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.is_leader = is_leader
        self.renewing = renewing
        self.clock = clock
        # What renewals are timed on (`_Memory.renewals`): this process's own clock, never a holder's.
        self.monotonic = monotonic
        self.actor = Actor(controller=REPORTING_CONTROLLER, instance=settings.identity)
        self._lock = threading.Lock()
        self._memory: dict[tuple[str, str], _Memory] = {}
        # One S3 client per store location (creating one costs far more than a call).
        self._stores: dict[tuple[str, str], S3Store] = {}
        self.retention = Retention(
            kube, settings.result_store_location(), settings.result_retention_seconds, self._s3
        )
        # Writes a pass sends alongside its own (`_materialize`): one pool for all passes, never
        # the pool that runs them (a pass waiting on a write queued behind passes would deadlock).
        # The API client's pool has a connection for each (scheduler/main.py).
        self._alongside = ThreadPoolExecutor(
            max_workers=settings.reconcile_threads, thread_name_prefix="alongside"
        )

    # --- entry points (called from kopf handlers, in kopf's thread pool) ------------------------------

    def kick(self, namespace: str, name: str) -> bool:
        """Reconcile now, unless a pass is running: then that pass runs once more when it ends.

        False when the last pass found the Campaign gone or being deleted (the periodic tick then
        forgets it); True otherwise, also when the request was handed to a running pass."""
        memory = self._remember(namespace, name)
        with self._lock:
            if memory.running:
                memory.again = True
                return True
            memory.running = True
        try:
            while True:
                pause = memory.last_started + self.settings.min_reconcile_interval_seconds - time.monotonic()
                if pause > 0:
                    threading.Event().wait(pause)
                memory.last_started = time.monotonic()
                live = self.reconcile(namespace, name)
                with self._lock:
                    if not memory.again:
                        memory.running = False
                        return live
                    memory.again = False
        except BaseException:
            with self._lock:
                memory.running = False
                memory.again = False
            raise

    def shard_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        """A Shard changed. Reconcile its campaign when the change matters to scheduling (a phase
        change or new cost); heartbeats that only renew the lease do not."""
        spec = body.get("spec") or {}
        campaign = spec.get("campaign")
        name = (body.get("metadata") or {}).get("name")
        if not campaign or not name:
            return
        status = body.get("status") or {}
        marker = (str(status.get("phase") or ShardPhase.QUEUED), float(status.get("cost") or 0.0))
        memory = self._remember(namespace, str(campaign))
        if memory.shard_seen.get(str(name)) == marker:
            return
        memory.shard_seen[str(name)] = marker
        self.kick(namespace, str(campaign))

    def reconcile(self, namespace: str, name: str) -> bool:
        """One pass (retried on conflicts). False when the Campaign is gone or being deleted."""
        if not self.is_leader():
            log.debug("not the leader: skipping %s/%s", namespace, name)
            return True
        started = time.monotonic()
        outcome = "ok"
        try:
            for round_ in range(CONFLICT_ROUNDS):
                try:
                    return self._once(namespace, name)
                except Conflict:
                    # The campaign (or a shard we planned from) changed under us: read again, decide again.
                    if round_ == CONFLICT_ROUNDS - 1:
                        outcome = "conflict"
                        log.info("campaign %s/%s kept changing; next pass decides", namespace, name)
            return True
        except WriteRefused as refused:
            # The leadership ran out during the pass (the Kube's write guard, leader.py): what was
            # not sent stays unsent, and the status, unwritten, leaves it all to the next leader.
            outcome = "not-leader"
            log.warning("pass over campaign %s/%s stopped: %s", namespace, name, refused)
            return True
        except Exception:
            outcome = "error"
            raise
        finally:
            self.metrics.reconcile_seconds.labels(outcome=outcome).observe(time.monotonic() - started)

    # --- one pass --------------------------------------------------------------------------------------

    def _remember(self, namespace: str, name: str) -> _Memory:
        with self._lock:
            return self._memory.setdefault((namespace, name), _Memory(renewals=Renewals(self.monotonic)))

    def _once(self, namespace: str, name: str) -> bool:
        """One pass; False (and nothing done) when the Campaign is gone or being deleted."""
        key = f"{namespace}/{name}"
        body = campaigns.get(self.kube, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            with self._lock:
                self._memory.pop((namespace, name), None)
            self.metrics.forget_campaign(key)
            return False
        now = self.clock()
        try:
            campaign = Campaign.parse(body)
        except ValidationError as error:
            self._invalid(body, ConditionReason.INVALID_SPEC, _validation_message(error), now)
            return True
        memory = self._remember(namespace, name)
        try:
            items = self._items(campaign, memory)
        except campaigns.ItemsUnavailable as problem:
            self._invalid(body, problem.reason, problem.message, now)
            return True
        if campaign.current_status.result_store is None:
            recorded = self._record_store(body, campaign, len(items), now)
            if recorded is None:
                return True
            body, campaign = recorded, Campaign.parse(recorded)
        # Bounded by the window once Done shards are folded: the live shards plus the Done ones of
        # the last pass (and, with the ConfigMap store, which does not fold, its ≤ 1000 shards).
        listed = shardview.of_campaign(list_shards(self.kube, namespace, name), campaign)
        folded = campaign.current_status.folded
        seen = _Observed(
            body=body,
            campaign=campaign,
            items=items,
            shards={s.name: s for s in ledger.unfolded(listed, folded)},
            jobs=jobs.list_workers(self.kube, namespace, name),
            pods=jobs.list_worker_pods(self.kube, namespace, name),
            leftovers=[s for s in listed if ledger.is_folded(s, folded)],
        )
        status = campaign.current_status
        retried = self._retry(seen, now)
        sweep = self._sweep(seen, memory, now)
        # Materialize, pause and resume do not depend on breakers; folding after them takes in the
        # entries this pass wrote, so the next pass has nothing new to fold (and no status to rewrite).
        first = self._plan(seen, breakers.breakers_from_status(status), now)
        self._act(seen, first, now)
        fold = self._fold(seen, status)
        plan = self._plan(seen, fold.states, now)
        self._start_workers(seen, plan)
        self._write_status(seen, plan, fold, sweep.stuck, retried, now)
        # The status now records the fold, the retry and the stalls (or already did): only now does
        # this process remember them and say so. A pass whose write lost (Conflict, an error, the
        # leadership gone) left neither, and the pass that runs again folds and announces them once.
        self._commit_fold(seen, fold, now)
        self._announce_retry(seen, retried, now)
        self._announce_stalls(seen, memory, sweep, now)
        self.metrics.dispatch.labels(campaign=key, reason=str(plan.reason)).inc()
        self._retain(seen)
        self._expire(campaign, now)
        return True

    def _retain(self, seen: _Observed) -> None:
        """A finished campaign with a result retention: record what goes when (retention.py)."""
        try:
            self.retention.record(seen.campaign, seen.shards.values())
        except StoreUnavailable as error:
            log.warning(
                "recording the retention of %s failed, next pass retries: %s", seen.campaign.name, error
            )

    def _expire(self, campaign: Campaign, now: dt.datetime) -> None:
        """spec.ttlSecondsAfterFinished passed since the campaign finished: delete it (its Shards and
        worker Jobs follow by owner reference; stored results are not touched)."""
        ttl = campaign.spec.ttl_seconds_after_finished
        status = campaign.current_status
        complete = status.condition(str(ConditionType.COMPLETE))
        if ttl is None or complete is None or complete.status != "True":
            return
        if status.phase not in (CampaignPhase.SUCCEEDED, CampaignPhase.COMPLETED):
            return
        if now < complete.last_transition_time + dt.timedelta(seconds=ttl):
            return
        log.info(
            "campaign %s/%s finished at %s: deleting it (spec.ttlSecondsAfterFinished %ds)",
            campaign.namespace,
            campaign.name,
            complete.last_transition_time.isoformat(),
            ttl,
        )
        with contextlib.suppress(NotFound):  # deleted meanwhile
            self.kube.delete(CAMPAIGNS, campaign.namespace, campaign.name)

    # --- the result store ----------------------------------------------------------------------------

    def _record_store(self, body: JSON, campaign: Campaign, items: int, now: dt.datetime) -> JSON | None:
        """Fix the campaign's result store in its status before its first shard is cut, once it is
        known to fit and to answer; None (Ready=False naming the fix, nothing cut) when not."""
        installation = self.settings.result_store_location()
        location = resolve_result_store(campaign.spec.result_store, installation)
        problem = store.capacity_problem(location, campaign.spec.expected_shards(items))
        if problem is not None:
            self._invalid(body, ConditionReason.RESULT_STORE_TOO_SMALL, problem, now)
            return None
        # The operator holds the installation's credentials only (`_s3` is None otherwise): a campaign
        # with its own Secret is checked by its workers (a store error fails their attempt, unavailable).
        s3 = self._s3(campaign.namespace, location) if location.type is StoreType.S3 else None
        if s3 is not None:
            try:
                s3.probe()
            except StoreUnavailable as unavailable:
                self._invalid(body, ConditionReason.RESULT_STORE_UNAVAILABLE, str(unavailable), now)
                return None
        try:
            return campaigns.patch_status(
                self.kube,
                campaign.namespace,
                campaign.name,
                {"resultStore": location.to_dict()},
                body["metadata"].get("resourceVersion"),
            )
        except Conflict:
            return None

    # --- items -------------------------------------------------------------------------------------------

    def _items(self, campaign: Campaign, memory: _Memory) -> Sequence[Item]:
        source = campaign.spec.items_from
        if campaign.spec.items is None and source is None:  # pragma: no cover - the model requires one
            raise campaigns.ItemsUnavailable(ConditionReason.NO_ITEMS, "set spec.items or spec.itemsFrom")
        # The input is read (and checked) once per spec generation: items are the campaign's input
        # and are not expected to change under a running campaign; a fixed spec (new generation)
        # reads them again.
        cache_key = (
            campaign.metadata.uid or "",
            campaign.generation,
            source.describe() if source else "items",
        )
        if memory.items_key == cache_key:
            return memory.items
        items: Sequence[Item]
        if source is None:
            items = campaign.spec.items or []
            self._check_shard_items(items, campaign, "spec.items")
        elif source.object is not None:
            items = self._streamed_items(campaign, source.object)  # checked as it is counted
        else:
            items, _ = campaigns.read_items(self.kube, campaign.namespace, source)
            self._check_shard_items(items, campaign, f"ConfigMap {source.config_map_name}")
        memory.items_key, memory.items = cache_key, items
        return items

    @staticmethod
    def _check_shard_items(items: Sequence[Item], campaign: Campaign, where: str) -> None:
        try:
            check_shard_items(items, campaign.spec.shard_size, where)
        except ShardItemsTooLarge as error:
            raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_INVALID, str(error)) from None

    def _streamed_items(self, campaign: Campaign, source: ItemsObject) -> StreamedItems:
        """The items of an object in the campaign's S3 store, counted (every line checked) now and
        later read slice by slice as shards are cut: memory follows the window, not the file."""
        location = campaign.current_status.result_store or resolve_result_store(
            campaign.spec.result_store, self.settings.result_store_location()
        )
        s3 = self._s3(campaign.namespace, location) if location.type is StoreType.S3 else None
        items = object_items(source, s3, campaign.spec.shard_size)
        try:
            items.total()
        except (ShardItemsTooLarge, NotJsonlText) as error:
            raise campaigns.ItemsUnavailable(ConditionReason.ITEMS_INVALID, str(error)) from None
        except ValueError as error:
            raise campaigns.ItemsUnavailable(
                ConditionReason.ITEMS_INVALID, f"{error}; fix that line in {items.where}"
            ) from None
        except StoreUnavailable as error:
            raise campaigns.ItemsUnavailable(ConditionReason.RESULT_STORE_UNAVAILABLE, str(error)) from None
        return items

    # --- recorded requests ---------------------------------------------------------------------------

    def _retry(self, seen: _Observed, now: dt.datetime) -> _RetryResult | None:
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
            if self._transition(seen, seen.shards[name], request, now):
                retried.append(name)
        retried.sort()
        scope = f"{len(set(listed))} listed" if listed else "every Blocked and Failed shard"
        note = (
            f"spec.retry.generation={wanted} ({scope}): {len(retried)} shard(s) back to Pending"
            + conditions.listing(retried)
            + retry_logic.skipped_text(choice.skipped)
        )
        return _RetryResult(wanted, note)

    def _announce_retry(self, seen: _Observed, retried: _RetryResult | None, now: dt.datetime) -> None:
        """After the status write that records the request as acted on."""
        if retried is None:
            return
        campaigns.record_event(
            self.kube, seen.body, reason=RETRY_STARTED, note=retried.note, actor=self.actor, now=now
        )

    # --- lease sweep --------------------------------------------------------------------------------------

    def _sweep(self, seen: _Observed, memory: _Memory, now: dt.datetime) -> _Sweep:
        """The heartbeat table of `logic.leases` for every Running shard. Returns the shards found
        stuck, and those of them to announce once the status says they are stalled."""
        spec = seen.campaign.spec
        sweep = _Sweep()
        stuck = sweep.stuck
        running = {n for n, s in seen.shards.items() if shardview.phase_of(s) is ShardPhase.RUNNING}
        for gone in set(memory.progress) - running:
            del memory.progress[gone]
        # Bounded by the window: the Running shards of this pass.
        memory.renewals.keep_only({seen.shards[n].lease_name for n in running})
        for name in sorted(running):
            shard = seen.shards[name]
            status = shard.current_status
            mark = self._progress_mark(memory, shard, now)
            # Judged first on the shard's own status (each heartbeat writes leaseUntil there as the
            # Lease has it, after renewing the Lease): only a shard that looks expired or stuck costs
            # a Lease read, and the Lease then decides. A pass reads the Leases of its suspects, not
            # one per Running shard. A Lease released while its shard still says Running (a worker
            # whose release transition failed) is found when the shard's leaseUntil passes.
            lease: JSON | None = None
            silent = shardview.claim_silence(memory.renewals, shard, None)
            observation = shardview.lease_observation(
                shard, None, spec.lease_seconds, spec.effective_heartbeat_seconds, mark.changed_at, silent
            )
            verdict = classify_lease(observation, now, spec.stall.heartbeats)
            if verdict.verdict in (LeaseVerdict.ZOMBIE, LeaseVerdict.STUCK):
                lease = leases.read(self.kube, shard.namespace, shard.lease_name)
                silent = shardview.claim_silence(memory.renewals, shard, lease)
                observation = shardview.lease_observation(
                    shard,
                    lease,
                    spec.lease_seconds,
                    spec.effective_heartbeat_seconds,
                    mark.changed_at,
                    silent,
                )
                verdict = classify_lease(observation, now, spec.stall.heartbeats)
            if verdict.verdict is not LeaseVerdict.ZOMBIE and shardview.taken_over(shard, lease):
                # Another worker holds the Lease since the shard was written and renews it: the
                # progress this view shows is the old claim's, so nothing is judged from it.
                memory.progress.pop(name, None)
                continue
            attempt = max(status.attempt, 1)
            if verdict.verdict is LeaseVerdict.STUCK:
                stuck.append(name)
                if not mark.reported:
                    sweep.to_announce.append((shard, attempt, verdict.reason))
            action = lease_action(verdict.verdict, spec.stall.policy, attempt, spec.max_attempts)
            if action is None:
                continue
            zombie = verdict.verdict is LeaseVerdict.ZOMBIE
            try:
                finished = self._finished_result(seen.campaign, shard) if zombie else None
            except StoreUnavailable as unavailable:
                log.warning("%s: cannot look for its stored result, judging it later: %s", name, unavailable)
                continue
            held = lease is not None and bool((lease.get("spec") or {}).get("holderIdentity"))
            if held and lease is not None and not leases.revoke(self.kube, lease):
                continue  # renewed since we read it: alive after all
            if finished is not None:
                # A zombie whose result verifies finished its work: Done, never charged or Blocked;
                # then its result is committed for reuse, as the worker that completes one does.
                found, stored = finished
                done = completion(shard, stored, f"{verdict.reason}; completed by the operator")
                completed = self._transition(seen, shard, done, now)
                if not completed and held:
                    completed = self._transition_claim(seen, shard, done, now)
                if completed:
                    commit_for_reuse(found, shard, stored)
                continue
            error = ShardError(
                error_class=ErrorClass.UNKNOWN if zombie else ErrorClass.TIMEOUT,
                source=status.source or shard.spec.source,
                message=("worker lost: " if zombie else "no progress: ") + verdict.reason,
                at=now,
            )
            request = TransitionRequest(
                action,
                f"{verdict.reason}; attempt {attempt} of {spec.max_attempts}",
                updates={
                    "owner": None,
                    "lease_until": None,
                    "last_heartbeat": None,
                    "not_before": None,
                    "last_error": error,
                },
            )
            if not self._transition(seen, shard, request, now) and held:
                # The Lease is taken back, so its holder is fenced (its next renewal fails), but a write
                # it had already sent moved the shard: record the action on the shard as it is now, or
                # the next pass would find a Lease without a holder and call it an expired lease.
                self._transition_claim(seen, shard, request, now)
        return sweep

    def _finished_result(self, campaign: Campaign, shard: Shard) -> tuple[ResultStore, StoredResult] | None:
        """The zombie's result, with its store, if it is stored and verifies (at most two store
        reads); None also when the operator cannot read the campaign's store (its own
        credentialsSecret): a worker taking the expired Lease over looks it up then
        (`store.finished`)."""
        location = store.location_of(campaign)
        if location.type is StoreType.S3:
            found: ResultStore | None = self._s3(campaign.namespace, location)
        else:
            found = store.open_store(self.kube, campaign.namespace, location)
        stored = None if found is None else stored_result_of(found, shard)
        return None if found is None or stored is None else (found, stored)

    def _transition_claim(
        self, seen: _Observed, shard: Shard, request: TransitionRequest, now: dt.datetime
    ) -> bool:
        """Apply `request` to the shard as it is now, while it still shows the claim it was decided on."""
        then = shard.current_status
        for _ in range(CONFLICT_ROUNDS):
            try:
                fresh = Shard.parse(self.kube.get(SHARDS, shard.namespace, shard.name))
            except NotFound:
                return False
            status = fresh.current_status
            same = (status.owner, status.attempt) == (then.owner, then.attempt)
            if fresh.phase is not ShardPhase.RUNNING or not same:
                return False
            if self._transition(seen, fresh, request, now):
                return True
        return False

    def _progress_mark(self, memory: _Memory, shard: Shard, now: dt.datetime) -> _Progress:
        status = shard.current_status
        done = status.progress.done if status.progress is not None else 0
        attempt = max(status.attempt, 1)
        mark = memory.progress.get(shard.name)
        if mark is None or mark.attempt != attempt:
            # First sight of this attempt: still since now, on this process's clock — the claim's
            # own time is the holder's clock, which may run behind (`logic.leases`, "Whose clock").
            mark = _Progress(attempt, done, now)
            memory.progress[shard.name] = mark
        elif done > mark.done:
            mark.done, mark.changed_at, mark.reported = done, now, False
        return mark

    def _announce_stalls(self, seen: _Observed, memory: _Memory, sweep: _Sweep, now: dt.datetime) -> None:
        """A Stalled Event per newly stuck attempt, after the status write whose Stalled condition
        names it; once per attempt (until its progress moves again)."""
        key = f"{seen.campaign.namespace}/{seen.campaign.name}"
        policy = seen.campaign.spec.stall.policy
        for shard, attempt, reason in sweep.to_announce:
            mark = memory.progress.get(shard.name)
            if mark is None or mark.attempt != attempt or mark.reported:
                continue
            mark.reported = True
            self.metrics.stalls.labels(campaign=key).inc()
            events.record(
                self.kube,
                events.event_body(
                    shard.to_dict(),
                    reason="Stalled",
                    note=f"{reason}; stall policy {policy}",
                    action="Stall",
                    controller=self.actor.controller,
                    instance=self.actor.instance,
                    now=now,
                    warning=True,
                ),
            )

    # --- history -> breakers --------------------------------------------------------------------------

    def _fold(self, seen: _Observed, status: CampaignStatus) -> _FoldResult:
        """Fold the history entries not folded yet into the breakers the status holds: per shard the
        entries above the sequence the status says was folded (`state.history`). Nothing is counted
        or announced here: the status write of this pass records the fold (the breakers and the new
        sequences together), and `_commit_fold` counts and announces it once that write is in. A
        pass whose write is lost leaves the status as it was, so the next pass (or the next leader)
        folds the same entries again, once."""
        outcomes = history.new_outcomes(
            seen.shards.values(), status.history_folded, status.history_folded_until
        )
        policies = breakers.breaker_policies(seen.campaign.spec)
        fold = history.fold_breakers(
            breakers.breakers_from_status(status), outcomes, policies, breakers.UNDECLARED_SOURCE_POLICY
        )
        return _FoldResult(
            fold.states,
            fold.reasons,
            history.folded_marks(seen.shards.values(), status.history_folded),
            history.watermark_after(status.history_folded_until, outcomes),
            outcomes,
            fold.opened,
            fold.closed,
        )

    def _commit_fold(self, seen: _Observed, fold: _FoldResult, now: dt.datetime) -> None:
        """The fold is in the status: count it, announce the breakers it turned."""
        spec = seen.campaign.spec
        key = f"{seen.campaign.namespace}/{seen.campaign.name}"
        counts = history.tally(fold.outcomes)
        if counts.claims:
            self.metrics.claims.labels(campaign=key).inc(counts.claims)
        if counts.lease_expirations:
            self.metrics.lease_expirations.labels(campaign=key).inc(counts.lease_expirations)
        if counts.blocked:
            self.metrics.blocked.labels(campaign=key).inc(counts.blocked)
        for cls, n in counts.retries.items():
            self.metrics.retries.labels(campaign=key, error_class=cls).inc(n)
        for cls, n in counts.failed.items():
            self.metrics.failed.labels(campaign=key, error_class=cls).inc(n)
        for source in fold.opened:
            fallback = next((s.fallback for s in spec.sources or [] if s.name == source), None)
            then = f"its shards use fallback {fallback}" if fallback else "its shards wait for the cooldown"
            campaigns.record_event(
                self.kube,
                seen.body,
                reason="BreakerOpened",
                note=f"source {source}: {fold.reasons.get(source, 'rate limited')}; {then}",
                actor=self.actor,
                now=now,
                warning=True,
            )
        for source in fold.closed:
            campaigns.record_event(
                self.kube,
                seen.body,
                reason="BreakerClosed",
                note=f"source {source} answered again: claims resume",
                actor=self.actor,
                now=now,
            )
        for source, breaker in fold.states.items():
            state = effective(breaker, now, breakers.cooldown_of(spec, source))
            self.metrics.breaker_state.labels(campaign=key, source=source).set(BREAKER_VALUES[state])

    # --- planning and acting -----------------------------------------------------------------------------

    def _plan(self, seen: _Observed, states: dict[str, SourceBreaker], now: dt.datetime) -> DispatchPlan:
        # The inputs come from `observe`, the one mapping of live objects to planner inputs, which
        # `kubectl campaign plan` uses too: its dry run is this plan.
        grace = dt.timedelta(seconds=self.settings.worker_pending_grace_seconds)
        podless = workers.podless_jobs(seen.jobs, seen.pods, now, grace)
        inputs = observe.dispatch_inputs(
            seen.campaign,
            seen.shards.values(),
            seen.jobs,
            seen.pods,
            now,
            items_total=len(seen.items),
            breakers=states,
            pending_grace=grace,
            refusals=jobs.failed_creates(self.kube, seen.campaign.namespace, podless),
        )
        return plan_dispatch(inputs)

    def _item_progress(self, seen: _Observed) -> ItemProgress:
        return observe.item_progress(seen.campaign, seen.shards.values(), len(seen.items))

    def _act(self, seen: _Observed, plan: DispatchPlan, now: dt.datetime) -> None:
        hold = "campaign suspended (spec.suspend)" if seen.campaign.spec.suspend else "budget exhausted"
        if not seen.campaign.spec.suspend and error_threshold.held(seen.campaign):
            hold = "error threshold reached (condition ErrorThreshold)"
        for name in plan.pause:
            self._transition_named(seen, name, TransitionRequest(Action.PAUSE, f"paused: {hold}"), now)
        for name in plan.resume:
            self._transition_named(
                seen, name, TransitionRequest(Action.RESUME, "resumed: nothing holds it"), now
            )
        for name in plan.promote:
            self._transition_named(seen, name, TransitionRequest(Action.MATERIALIZE, "claimable"), now)
        self._materialize(seen, plan.materialize, now)
        self._maybe_finalize(seen, plan, now)

    def _materialize(self, seen: _Observed, count: int, now: dt.datetime) -> None:
        """Cut the next `count` shards (FIFO by item index) and make them Pending.

        The creates go one after another in index order, so a pass stopped anywhere leaves no gap
        below the highest shard cut (`observe.item_progress` counts the cut from it). Each new
        shard's Pending write goes alongside the next create (`_alongside`), which halves what a
        pass spends cutting (two round trips a shard, one after the other, before), and the pass
        waits for them all before it goes on; a write that fails stops the creates. A shard whose
        Pending write did not happen (the pass stopped) is Queued, and the next pass promotes it."""
        if count <= 0:
            return
        progress = self._item_progress(seen)
        size = seen.campaign.spec.shard_size
        first = -(-progress.cut_items // size)
        phases = [shardview.phase_of(s) for s in seen.shards.values()]
        pending, running = phases.count(ShardPhase.PENDING), phases.count(ShardPhase.RUNNING)
        # At most `count` (the planner's cut, bounded by the backlog): one per shard of this pass.
        writes: list[Future[bool]] = []
        try:
            for position, index in enumerate(range(first, first + count), start=1):
                start, end = builders.shard_slice(len(seen.items), size, index)
                if start >= end or any(w.done() and w.exception() is not None for w in writes):
                    break
                body = builders.shard_body(seen.campaign, index, seen.items)
                # What this shard was planned from, so the backlog bound can be checked exactly after
                # the fact: pending + position <= backlogRatio * max(running, 1) of this snapshot.
                body["metadata"].setdefault("annotations", {})[PLANNED_FROM_ANNOTATION] = (
                    f"pending={pending},running={running},position={position}"
                )
                shard = self._create_shard(seen, body)
                if shard is None:
                    break
                message = f"items {start}..{end - 1} of {len(seen.items)}"
                request = TransitionRequest(Action.MATERIALIZE, message)
                writes.append(self._alongside.submit(self._transition, seen, shard, request, now))
        finally:
            futures.wait(writes)
        for write in writes:
            write.result()  # the first failure, as the pass would have met it

    def _maybe_finalize(self, seen: _Observed, plan: DispatchPlan, now: dt.datetime) -> None:
        campaign = seen.campaign
        spec = campaign.spec
        if spec.finalize is None or shardview.finalize_name(campaign.name) in seen.shards:
            return
        if self._item_progress(seen).uncut_shards:
            return
        work = [s for s in seen.shards.values() if s.spec.shard_class is ShardClass.WORK]
        if not all(shardview.phase_of(s).terminal for s in work):
            return
        gate = self._gate(seen)
        if spec.suspend or not allows(gate, ShardClass.FINALIZE):
            return
        # The campaign's shape, not the live shards: folded work shards are gone from the listing.
        body = builders.finalize_shard_body(campaign, seen.items)
        shard = self._create_shard(seen, body)
        if shard is not None:
            note = f"all {len(work)} work shard(s) finished: the closing step may start"
            self._transition(seen, shard, TransitionRequest(Action.MATERIALIZE, note), now)

    def _gate(self, seen: _Observed) -> BudgetGate:
        views = [shardview.shard_view(s) for s in seen.shards.values()]
        return observe.campaign_budget(seen.campaign, views).gate

    def _create_shard(self, seen: _Observed, body: JSON) -> Shard | None:
        name = body["metadata"]["name"]
        try:
            created = self.kube.create(SHARDS, seen.campaign.namespace, body)
        except AlreadyExists:
            # A previous pass created it and stopped before materializing: take it as it is. Unless
            # it is a deleted campaign's of the same name: the garbage collector removes it, the
            # shard is cut again after that.
            try:
                created = self.kube.get(SHARDS, seen.campaign.namespace, name)
            except NotFound:
                return None
            if not shardview.of_campaign([Shard.parse(created)], seen.campaign):
                log.info(
                    "shard %s/%s is a deleted campaign's of the same name: cut once it is gone",
                    seen.campaign.namespace,
                    name,
                )
                return None
        except ApiError as error:
            log.error("creating shard %s/%s failed: %s", seen.campaign.namespace, name, error)
            return None
        shard = Shard.parse(created)
        seen.shards[shard.name] = shard
        if shard.phase not in (None, ShardPhase.QUEUED):
            return None
        return shard

    def _start_workers(self, seen: _Observed, plan: DispatchPlan) -> None:
        """Start the planned worker Jobs (the planner already held them back where it had to)."""
        if not plan.start_workers:
            return
        classes = [seen.shards[n].spec.shard_class for n in plan.claimable if n in seen.shards]
        worker = builders.worker_spec_for(seen.campaign.spec, classes)
        first = workers.next_worker_number(seen.jobs)
        for number, slots in enumerate(plan.start_workers, start=first):
            body = builders.worker_job_body(
                seen.campaign,
                worker,
                self.settings.worker_service_account,
                self.settings.worker_metrics(),
                number=number,
                slots=slots,
                pod_defaults=self.settings.worker_pod_defaults(),
            )
            try:
                job = jobs.create(self.kube, seen.campaign.namespace, body)
            except ApiError as error:
                log.error(
                    "creating worker Job %s for %s failed: %s",
                    body["metadata"]["name"],
                    seen.campaign.name,
                    error,
                )
                return
            seen.jobs.append(job)

    def _transition_named(
        self, seen: _Observed, name: str, request: TransitionRequest, now: dt.datetime
    ) -> bool:
        shard = seen.shards.get(name)
        return shard is not None and self._transition(seen, shard, request, now)

    def _transition(
        self, seen: _Observed, shard: Shard, request: TransitionRequest, now: dt.datetime
    ) -> bool:
        """Apply one transition. A Conflict means the shard moved since we read it: left for the next pass."""
        try:
            updated = apply_transition(self.kube, shard, request, self.actor, now)
        except (Conflict, NotFound):
            return False
        seen.shards[updated.name] = updated
        return True

    # --- status ----------------------------------------------------------------------------------------

    def _write_status(
        self,
        seen: _Observed,
        plan: DispatchPlan,
        fold: _FoldResult,
        stuck: list[str],
        retried: _RetryResult | None,
        now: dt.datetime,
    ) -> None:
        """Write the status when it changed; returns once it is committed (written, or already so),
        raises when the write lost (Conflict) or failed."""
        campaign = seen.campaign
        spec = campaign.spec
        previous = campaign.current_status
        to_fold, folded = self._record_fold(seen)
        gone = {s.name for s in to_fold}
        live = [s for s in seen.shards.values() if s.name not in gone]
        views = [shardview.shard_view(s) for s in live]
        facts = observe.campaign_facts(campaign, live, len(seen.items), folded)
        agg = aggregate(views, now, facts)
        limits = {limit.reason: limit.message for limit in plan.limits}
        open_sources = [
            source
            for source, b in fold.states.items()
            if effective(b, now, breakers.cooldown_of(spec, source)) is not BreakerState.CLOSED
        ]
        work_total = spec.expected_shards(len(seen.items))
        desired: list[DesiredCondition] = [
            conditions.ready(
                None, f"{len(seen.items)} item(s) in {work_total} shard(s) of {spec.shard_size}"
            ),
            conditions.backpressured(limits.get(LimitReason.BACKPRESSURE)),
            conditions.cluster_full(limits.get(LimitReason.CLUSTER_FULL)),
            *agg.conditions,
            conditions.budget_held(plan.budget_hold, agg.budget, campaign.name),
            conditions.stalled(sorted(stuck)),
            conditions.breaker_open(sorted(open_sources)),
            conditions.scheduled(self.settings.identity, self.renewing()),
            conditions.workers_failing(limits.get(LimitReason.WORKERS_FAILING)),
            error_threshold.error_threshold_condition(campaign, seen.shards.values()),
        ]
        merged = builders.merge_conditions(previous.conditions, desired, now, campaign.generation)
        new = builders.campaign_status(
            agg,
            builders.StatusFacts(
                generation=campaign.generation,
                items_total=len(seen.items),
                work_shards_total=work_total,
                has_finalize=spec.finalize is not None,
                uncut_shards=facts.uncut_shards,
                cut_shards=-(-facts.items.cut_items // spec.shard_size),
                materialized=len(live) + folded.shards,
                breakers=builders.breakers_to_status(spec, fold.states, fold.reasons, previous, now),
                conditions=merged,
                last_retry_generation=(
                    retried.generation if retried is not None else previous.last_retry_generation
                ),
                history_folded={name: seq for name, seq in fold.marks.items() if name not in gone},
                history_folded_until=fold.watermark,
                budget_limit=spec.budget.limit if spec.budget is not None else None,
            ),
            previous,
        ).model_copy(
            update={
                "folded": folded,
                "tokens": ledger.campaign_tokens(previous.tokens, folded, live),
                # For workers mid-shard, which read the Campaign at heartbeat but list no shards.
                "source_cooldowns": cooldowns.status_list(cooldowns.source_cooldowns(campaign, live, now)),
            }
        )
        self._metrics(seen, agg.counts, agg.oldest_pending_age, agg.budget.spent, new)
        if campaign.status is not None and not builders.status_differs(campaign.status, new):
            self._delete_folded(seen, seen.leftovers)
            return
        resource_version = seen.body["metadata"].get("resourceVersion")
        campaigns.patch_status(
            self.kube,
            campaign.namespace,
            campaign.name,
            builders.status_patch(previous, new),
            resource_version,
        )
        # Recorded in the ledger and counted in the status: only now may the Shards go.
        failpoints.hit(failpoints.FOLD_RECORDED)
        self._delete_folded(seen, [*seen.leftovers, *to_fold])
        # After the write: a pass that lost the write (Conflict) and runs again must not repeat them.
        self._announce(seen, previous.conditions, merged, now)

    # --- folding Done shards -------------------------------------------------------------------------

    def _record_fold(self, seen: _Observed) -> tuple[list[Shard], FoldedShards]:
        """Write the ledger segment of the Done shards to fold this pass; what status.folded becomes.

        First of three crash-safe steps (ledger, status, delete): a segment whose status write is
        lost is ignored by readers (its indices are not in doneRanges) and written again later.
        Before it, each shard's recorded result is committed for reuse (`commit_recorded`: a no-op
        where its worker committed it, as it does unless it died right after its Done write).
        Only S3 stores fold, and only those the operator holds credentials for; ConfigMap campaigns
        (at most 1000 shards) keep their Done shards."""
        previous = seen.campaign.current_status.folded
        candidates = ledger.foldable(seen.shards.values(), previous)[:MAX_FOLD]
        store = self._ledger_store(seen.campaign)
        if not candidates or store is None:
            return [], previous
        folded = ledger.fold(previous, candidates, seen.campaign.spec.error_threshold.window)
        try:
            # One conditional PUT a shard, answered "already there" when its worker committed.
            for shard in candidates:
                commit_recorded(store, shard)
            store.write_ledger(
                seen.campaign.name,
                seen.campaign.metadata.uid or "",
                folded.sequence,
                [ledger.record(s) for s in candidates],
            )
        except StoreUnavailable as error:
            log.warning("campaign %s: ledger not written, folding later: %s", seen.campaign.name, error)
            return [], previous
        return candidates, folded

    def _ledger_store(self, campaign: Campaign) -> S3Store | None:
        location = campaign.current_status.result_store
        if location is None or location.type is not StoreType.S3:
            return None
        return self._s3(campaign.namespace, location)

    def _s3(self, namespace: str, location: ResultStoreStatus) -> S3Store | None:
        """The S3 store at `location` with the operator's own credentials; None for a store whose
        credentials only the campaign's workers hold (its own credentialsSecret)."""
        if location.credentials_secret != self.settings.result_store_location().credentials_secret:
            return None
        key = (namespace, location.model_dump_json())
        with self._lock:
            if key not in self._stores:
                self._stores[key] = S3Store(location, namespace)
            return self._stores[key]

    def _delete_folded(self, seen: _Observed, shards: Sequence[Shard]) -> None:
        """Delete Shards the ledger and the status already hold, each with its Lease.

        The Lease goes with its Shard, not at the garbage collector's pace: the collector removes it
        by owner reference, but it can fall behind a campaign that folds fast, and the Leases alive
        are bounded by the window only if they go with their Shards. Right before the Shard: the
        collector reads every dependent it still knows of an owner deleted (0.99 GETs per shard
        measured when the Lease went after), none once it has seen the Lease go. A Done shard needs
        no Lease (nobody claims it again), so a crash between the two leaves a Shard the next pass
        deletes; a Lease left behind (a refused delete) is the collector's, as before."""
        for shard in shards:
            self._delete_lease_of(shard)
            try:
                self.kube.delete(SHARDS, shard.namespace, shard.name)
            except NotFound:
                pass
            except ApiError as error:
                log.warning("deleting folded shard %s failed, next pass retries: %s", shard.name, error)
                return
            seen.shards.pop(shard.name, None)

    def _delete_lease_of(self, shard: Shard) -> None:
        try:
            self.kube.delete(LEASES, shard.namespace, shard.name)
        except NotFound:
            pass
        except ApiError as error:
            log.info("the Lease of folded shard %s is left to the garbage collector: %s", shard.name, error)

    def _announce(
        self, seen: _Observed, before: list[Condition], after: list[Condition], now: dt.datetime
    ) -> None:
        """An Event when a condition a person should hear about turns True (or Ready turns False)."""
        old = {c.type: c for c in before}
        for condition in after:
            if not _news(old.get(condition.type), condition):
                continue
            warning = condition.type != str(ConditionType.COMPLETE) or condition.reason != "Succeeded"
            campaigns.record_event(
                self.kube,
                seen.body,
                reason=condition.reason,
                note=condition.message,
                actor=self.actor,
                now=now,
                warning=warning,
            )

    def _metrics(
        self,
        seen: _Observed,
        counts: Any,
        oldest: dt.timedelta | None,
        spent: float,
        status: CampaignStatus,
    ) -> None:
        key = f"{seen.campaign.namespace}/{seen.campaign.name}"
        self.metrics.set_phases(key, dict(counts))
        self.metrics.oldest_pending.labels(campaign=key).set(oldest.total_seconds() if oldest else 0.0)
        budget = seen.campaign.spec.budget
        if budget is not None:
            self.metrics.budget_ratio.labels(campaign=key).set(spent / budget.limit)
        self.metrics.set_tokens(key, status.tokens)

    def _invalid(self, body: JSON, reason: ConditionReason, message: str, now: dt.datetime) -> None:
        """Ready=False with the reason, an Event naming the fix (once per problem); nothing is created."""
        try:
            previous = CampaignStatus.model_validate(body.get("status") or {})
        except ValidationError:
            previous = CampaignStatus()
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        merged = builders.merge_conditions(
            previous.conditions, [conditions.ready(reason, message)], now, generation
        )
        new = previous.model_copy(
            update={"phase": CampaignPhase.INVALID, "observed_generation": generation, "conditions": merged}
        )
        if not builders.status_differs(previous if body.get("status") else None, new):
            return
        metadata = body.get("metadata") or {}
        log.warning(
            "campaign %s/%s is not usable: %s: %s",
            metadata.get("namespace"),
            metadata.get("name"),
            reason,
            message,
        )
        campaigns.patch_status(
            self.kube,
            str(metadata.get("namespace")),
            str(metadata.get("name")),
            new.to_merge_patch(),
            metadata.get("resourceVersion"),
        )
        # After the write, so a pass that lost it to a Conflict does not post the Event twice.
        old_ready = next((c for c in previous.conditions if c.type == str(ConditionType.READY)), None)
        if old_ready is None or (old_ready.status, old_ready.reason, old_ready.message) != (
            "False",
            reason,
            message,
        ):
            campaigns.record_event(
                self.kube, body, reason=reason, note=message, actor=self.actor, now=now, warning=True
            )


@dataclass(frozen=True)
class _FoldResult:
    """A fold computed by a pass, to be recorded by its status write and only then committed."""

    states: dict[str, SourceBreaker]
    reasons: dict[str, str]
    # status.historyFolded after this fold, for every shard the pass saw; the status write keeps
    # those still live (not folded into the ledger by the same write).
    marks: dict[str, int]
    # status.historyFoldedUntil (deprecated), still written for readers of earlier releases.
    watermark: dt.datetime | None
    outcomes: list[history.Outcome] = field(default_factory=list)
    opened: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _RetryResult:
    """A retry request acted on: the generation the status records, the note its Event carries."""

    generation: int
    note: str


@dataclass
class _Sweep:
    """What the lease sweep found: the stuck shards (the Stalled condition) and the stuck attempts
    not announced yet (shard, attempt, why), announced after the status write."""

    stuck: list[str] = field(default_factory=list)
    to_announce: list[tuple[Shard, int, str]] = field(default_factory=list)


# Conditions a person should hear about when they turn True.
_LOUD = frozenset(
    str(kind)
    for kind in (
        ConditionType.BUDGET_WARNING,
        ConditionType.BUDGET_EXHAUSTED,
        ConditionType.CLUSTER_FULL,
        ConditionType.SUSPENDED,
        ConditionType.COMPLETE,
        ConditionType.DEGRADED,
        ConditionType.WORKERS_FAILING,
        ConditionType.ERROR_THRESHOLD,
    )
)
# And those heard about only with one reason, when they take it. BudgetHeld: only when nothing
# running can lift it (at the warn ratio and the limit the two budget conditions above speak, and
# ReservedByRunning clears itself as running shards finish); it usually comes after
# ReservedByRunning, True all along, hence "takes the reason" rather than "turns True".
_LOUD_REASONS = frozenset({(str(ConditionType.BUDGET_HELD), str(ConditionReason.NO_ROOM_FOR_SHARD))})


def _news(was: Condition | None, now: Condition) -> bool:
    if now.status != str(ConditionStatus.TRUE):
        return False
    if now.type in _LOUD:
        return was is None or was.status != now.status
    if (now.type, now.reason) in _LOUD_REASONS:
        return was is None or (was.status, was.reason) != (now.status, now.reason)
    return False


def _validation_message(error: ValidationError) -> str:
    problems = []
    for item in error.errors()[:10]:
        where = ".".join(str(part) for part in item.get("loc", ()) if part != "__root__")
        problems.append(f"{where or 'spec'}: {item.get('msg')}")
    more = f" (+{error.error_count() - 10} more)" if error.error_count() > 10 else ""
    return "fix the Campaign (kubectl edit campaign): " + "; ".join(problems) + more
