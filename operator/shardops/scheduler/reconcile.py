"""The campaign reconcile: observe the campaign's objects, decide with `logic/`, act through `k8s/`.

One pass (`Reconciler`, through the collaborators it holds):
  1. read the Campaign; parse and validate it and its items (`items.Items`; a bad one: Ready=False,
     nothing created);
  2. observe its Shards, worker Jobs and their pods (`observed.observe`);
  3. act on recorded requests (`retry.Retry`: Blocked/Failed shards back to Pending) and sweep the
     leases of Running shards (`sweep.Sweeper`: zombies back to Pending, stalls reported or revoked);
  4. plan and carry the plan out (`dispatch.Dispatcher`): pause/resume, materialize shards within the
     backlog bound, the finalize shard once the work is done;
  5. fold the new shard history (this pass's included) into the per-source breakers
     (`history.fold_history`), plan again on what now exists, and keep the worker Jobs the plan wants;
  6. write the Done shards' ledger segment (`fold.LedgerFold`), compute the status the pass wants
     (`status.desired_status`, pure) and patch it if it differs; then delete the folded Shards and
     announce what the status now says (conditions that turned, the fold, the retry, the stalls).

Every shard transition goes through `writes.ShardWrites` (resourceVersion precondition + Event). A
Conflict on one shard means it moved meanwhile: it is left for the next pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from shardops import store
from shardops.api.campaign import Campaign
from shardops.api.common import JSON, Condition, Item
from shardops.api.enums import FINISHED_PHASES, ConditionReason, ConditionType, ShardPhase
from shardops.api.shard import Shard
from shardops.api.store import resolve_result_store
from shardops.clock import utcnow
from shardops.k8s import campaigns, events
from shardops.k8s.api import CAMPAIGNS, Conflict, Kube, NotFound, WriteRefused
from shardops.k8s.shards import Actor
from shardops.logic.leases import Renewals
from shardops.scheduler import builders, failpoints, history
from shardops.scheduler.dispatch import Dispatcher
from shardops.scheduler.fold import MAX_FOLD, LedgerFold
from shardops.scheduler.items import Items
from shardops.scheduler.memory import Memory
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.observed import Observed, observe
from shardops.scheduler.retention import Retention
from shardops.scheduler.retry import Retry
from shardops.scheduler.settings import REPORTING_CONTROLLER, OperatorSettings
from shardops.scheduler.sources import SourceSharing
from shardops.scheduler.status import (
    Decided,
    Desired,
    desired_status,
    invalid_status,
    turned,
    validation_message,
)
from shardops.scheduler.stores import store_secret_problem
from shardops.scheduler.sweep import Sweeper
from shardops.scheduler.writes import CONFLICT_ROUNDS, ShardWrites
from shardops.state import breakers, cooldowns, error_threshold
from shardops.state.sources import source_claims
from shardops.store.installation import Stores
from shardops.store.items import pin_patch
from shardops.store.records import StoreUnavailable

log = logging.getLogger(__name__)

__all__ = ["CONFLICT_ROUNDS", "MAX_FOLD", "Reconciler"]


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
        # What renewals are timed on (`Memory.renewals`): this process's own clock, never a holder's.
        self.monotonic = monotonic
        self.actor = Actor(controller=REPORTING_CONTROLLER, instance=settings.identity)
        self._lock = threading.Lock()
        # Bounded by the campaigns this process serves: a campaign found gone is forgotten.
        self._memory: dict[tuple[str, str], Memory] = {}
        self.stores = Stores(settings.result_store_location())
        self.writes = ShardWrites(kube, self.actor)
        # A campaign's passes run one at a time, and each touches only its campaign's series.
        self.event_series = events.EventSeries()
        self.items = Items(kube, self.stores)
        self.sweeper = Sweeper(kube, self.writes, self.stores, metrics, self.event_series)
        self.dispatch = Dispatcher(kube, settings, self.writes)
        self.ledger = LedgerFold(kube, self.stores, self.event_series)
        self.retry = Retry(kube, self.writes, self.stores)
        self.sharing = SourceSharing(kube, self.actor)
        self.retention = Retention(
            kube,
            settings.result_store_location(),
            settings.result_retention_seconds,
            self.stores.s3,
            is_leader,
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
        # The cost as written (a decimal string; a number on shards written before): a new text is news.
        marker = (str(status.get("phase") or ShardPhase.QUEUED), str(status.get("cost") or 0))
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

    def _remember(self, namespace: str, name: str) -> Memory:
        with self._lock:
            return self._memory.setdefault((namespace, name), Memory(renewals=Renewals(self.monotonic)))

    def _once(self, namespace: str, name: str) -> bool:
        """One pass; False (and nothing done) when the Campaign is gone or being deleted."""
        key = f"{namespace}/{name}"
        body = campaigns.get(self.kube, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            with self._lock:
                self._memory.pop((namespace, name), None)
            self.event_series.forget(namespace, name)
            self.sharing.forget(namespace, name)
            self.metrics.forget_campaign(key)
            return False
        now = self.clock()
        refused = self.settings.operator_namespace_problem(namespace, name)
        if refused is not None:
            self.sharing.report(namespace, name, [])  # no claims: the sharing pass need not wait for it
            self._invalid(body, ConditionReason.IN_OPERATOR_NAMESPACE, refused, now)
            return True
        try:
            campaign = Campaign.parse(body)
        except ValidationError as error:
            self.sharing.report(namespace, name, [])
            self._invalid(body, ConditionReason.INVALID_SPEC, validation_message(error), now)
            return True
        self.sharing.report(namespace, name, source_claims(campaign))
        memory = self._remember(namespace, name)
        if self.retention.sweeping(namespace, name):  # an earlier campaign's results are going now
            log.info(
                "campaign %s/%s waits: the results of an earlier one of its name are being deleted",
                namespace,
                name,
            )
            return True
        try:
            items = self.items.read(campaign, memory)
        except campaigns.ItemsUnavailable as problem:
            self._invalid(body, problem.reason, problem.message, now)
            return True
        if campaign.current_status.result_store is None:
            recorded = self._record_store(body, campaign, items, now)
            if recorded is None:
                return True
            body, campaign = recorded, Campaign.parse(recorded)
        seen = observe(self.kube, body, campaign, items)
        status = campaign.current_status
        # One GET while the campaign has no worker Job (its start, or all gone) and is not finished:
        # a missing store Secret is named before any shard is cut or pod would fail on it.
        if not seen.jobs and status.phase not in FINISHED_PHASES:
            missing = store_secret_problem(self.kube, campaign, self.settings.store_secret or None)
            if missing is not None:
                self._invalid(body, ConditionReason.STORE_SECRET_MISSING, missing, now)
                return True
        retried = self.retry.act(seen, now)
        # A retry of every gave-up shard cuts the folded ones again from the ledger, a segment at a
        # time as the backlog bound leaves room: status.folded as this pass leaves it before its fold.
        unfolded = self.retry.recut(seen, self.retry.start_walk(seen, retried), now)
        sweep = self.sweeper.sweep(seen, memory, now)
        # Materialize, pause and resume do not depend on breakers; folding after them takes in the
        # entries this pass wrote, so the next pass has nothing new to fold (and no status to rewrite).
        # The error threshold as this pass finds it: a trip holds this pass's cut and pauses the
        # Pending shards now, not a pass later once its condition is written and read back (shards
        # that fail at once would otherwise run a whole backlog past the threshold).
        threshold = error_threshold.error_threshold_condition(campaign, seen.shards.values())
        tripped = error_threshold.tripped_text(threshold)
        first = self.dispatch.plan(seen, breakers.breakers_from_status(status), now, tripped)
        try:
            self.dispatch.act(seen, first, now, tripped)
        except campaigns.ItemsUnavailable as problem:  # a streamed input changed while shards are cut
            memory.items_key = None  # read (and compare) it again next pass
            self._invalid(body, problem.reason, problem.message, now)
            return True
        fold = history.fold_history(seen, status)
        # One breaker per shared Source: this campaign adopts it (scheduler/sources.py).
        self.sharing.adopt_breakers(namespace, name, fold.states, campaign.spec)
        plan = self.dispatch.plan(seen, fold.states, now, tripped)
        self.dispatch.start_workers(seen, plan)
        to_fold, folded = self.ledger.record(seen, unfolded)
        decided = Decided(
            plan=plan,
            fold=fold,
            stuck=sweep.stuck,
            retry_generation=retried.generation if retried is not None else None,
            to_fold=to_fold,
            folded=folded,
            identity=self.settings.identity,
            renewing=self.renewing(),
            source_problems=self.sharing.problems_for(namespace, name, campaign.spec),
            error_threshold=threshold,
        )
        desired = desired_status(seen, decided, now)
        # The shares of shared Sources the sharing pass decided (scheduler/sources.py), and the waits
        # other campaigns on them were told, for the workers.
        shares = self.sharing.shares_for(namespace, name, status.source_shares, now)
        waits = cooldowns.later(
            {c.source: c for c in desired.status.source_cooldowns},
            self.sharing.cooldowns_for(namespace, name, now),
        )
        desired = dataclasses.replace(
            desired,
            status=desired.status.model_copy(
                update={"source_shares": shares, "source_cooldowns": cooldowns.status_list(waits)}
            ),
        )
        self._write_status(seen, desired, to_fold, now)
        # The status now records the fold, the retry and the stalls (or already did): only now does
        # this process remember them and say so. A pass whose write lost (Conflict, an error, the
        # leadership gone) left neither, and the pass that runs again folds and announces them once.
        history.commit(self.kube, self.metrics, self.actor, self.event_series, seen, fold, now)
        self.retry.announce(seen, retried, now)
        self.ledger.announce(seen, to_fold, self.actor, now)
        self.sweeper.announce(seen, memory, sweep, now)
        self.metrics.dispatch.labels(campaign=key, reason=str(plan.reason)).inc()
        self._retain(seen)
        self._expire(campaign, now)
        return True

    def _retain(self, seen: Observed) -> None:
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
        if status.phase not in FINISHED_PHASES:
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

    def _record_store(
        self, body: JSON, campaign: Campaign, items: Sequence[Item], now: dt.datetime
    ) -> JSON | None:
        """Fix the campaign's result store in its status before its first shard is cut, once it is
        known to fit and to answer; None (Ready=False naming the fix, nothing cut) when not."""
        installation = self.settings.result_store_location()
        location = resolve_result_store(campaign.spec.result_store, installation)
        problem = store.capacity_problem(location, campaign.spec.expected_shards(len(items)))
        if problem is not None:
            self._invalid(body, ConditionReason.RESULT_STORE_TOO_SMALL, problem, now)
            return None
        # The operator holds the installation's credentials only (`Stores.s3` is None otherwise): a campaign
        # with its own Secret is checked by its workers (a store error fails their attempt, unavailable).
        s3 = self.stores.s3_of(campaign.namespace, location)
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
                # What itemsFrom held at this first read is pinned with it (store.items).
                {"resultStore": location.to_dict(), **pin_patch(campaign, items)},
                body["metadata"].get("resourceVersion"),
            )
        except Conflict:
            return None

    # --- status ----------------------------------------------------------------------------------------

    def _write_status(self, seen: Observed, desired: Desired, to_fold: list[Shard], now: dt.datetime) -> None:
        """Patch the status when it differs from the desired one; returns once it is committed
        (written, or already so), raises when the write lost (Conflict) or failed. The Shards the
        ledger holds (`to_fold`) go only once the status counts them."""
        campaign = seen.campaign
        previous = campaign.current_status
        self._metrics(seen, desired)
        if campaign.status is not None and not builders.status_differs(campaign.status, desired.status):
            self.ledger.delete(seen, seen.leftovers)
            return
        campaigns.patch_status(
            self.kube,
            campaign.namespace,
            campaign.name,
            builders.status_patch(previous, desired.status),
            seen.body["metadata"].get("resourceVersion"),
        )
        # Recorded in the ledger and counted in the status: only now may the Shards go.
        failpoints.hit(failpoints.FOLD_RECORDED)
        self.ledger.delete(seen, [*seen.leftovers, *to_fold])
        # After the write: a pass that lost the write (Conflict) and runs again must not repeat them.
        self._announce(seen, previous.conditions, desired.conditions, now)

    def _announce(
        self, seen: Observed, before: list[Condition], after: list[Condition], now: dt.datetime
    ) -> None:
        """An Event when a condition a person should hear about turns True (or Ready turns False)."""
        for condition in turned(before, after):
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

    def _metrics(self, seen: Observed, desired: Desired) -> None:
        key = seen.key
        agg = desired.summary.aggregate
        self.metrics.set_phases(key, dict(agg.counts))
        oldest = agg.oldest_pending_age
        self.metrics.oldest_pending.labels(campaign=key).set(oldest.total_seconds() if oldest else 0.0)
        budget = seen.campaign.spec.budget
        if budget is not None:
            # Prometheus samples are floats: money becomes one here, at the boundary, and nowhere else.
            self.metrics.budget_ratio.labels(campaign=key).set(float(agg.budget.spent / budget.limit))
        self.metrics.set_tokens(key, desired.status.tokens)
        self.metrics.items_errored.labels(campaign=key).set(desired.status.items_errored or 0)

    def _invalid(self, body: JSON, reason: ConditionReason, message: str, now: dt.datetime) -> None:
        """Ready=False with the reason, an Event naming the fix (once per problem); nothing is created."""
        previous, new = invalid_status(body, reason, message, now)
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
