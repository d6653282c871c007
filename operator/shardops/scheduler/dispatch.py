"""Planning and carrying the plan out (`Dispatcher`): pause and resume shards, cut new ones within
the backlog bound, the finalize shard once the work is done, and the worker Jobs the plan wants.

The planner's inputs come from `state.observe`, the one mapping of live objects to planner inputs,
which `kubectl campaign plan` uses too: its dry run is this plan."""

from __future__ import annotations

import datetime as dt
import logging
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor

from shardops.api.enums import ShardClass, ShardPhase
from shardops.api.names import PLANNED_FROM_ANNOTATION
from shardops.k8s import jobs, kueue
from shardops.k8s.api import ApiError, KubeClient
from shardops.k8s.shards import TransitionRequest
from shardops.logic.breaker import SourceBreaker
from shardops.logic.budget import BudgetGate, allows
from shardops.logic.planner import DispatchPlan, plan_dispatch
from shardops.logic.transitions import Action
from shardops.scheduler import builders
from shardops.scheduler.observed import Observed
from shardops.scheduler.settings import OperatorSettings
from shardops.scheduler.writes import ShardWrites
from shardops.state import observe, shardview, workers
from shardops.state.sources import waiting_for_sources

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(self, kube: KubeClient, settings: OperatorSettings, writes: ShardWrites) -> None:
        self.kube = kube
        self.settings = settings
        self.writes = writes
        # Writes a pass sends alongside its own (`materialize`): one pool for all passes, never
        # the pool that runs them (a pass waiting on a write queued behind passes would deadlock).
        # The API client's pool has a connection for each (scheduler/main.py).
        self.alongside = ThreadPoolExecutor(
            max_workers=settings.reconcile_threads, thread_name_prefix="alongside"
        )

    def plan(
        self, seen: Observed, states: dict[str, SourceBreaker], now: dt.datetime, tripped: str | None = None
    ) -> DispatchPlan:
        """`tripped`: the hold text of an error-threshold trip this pass found (not yet written)."""
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
            queue=kueue.queue_state(self.kube, seen.campaign.namespace, seen.jobs),
            tripped=tripped,
        )
        return plan_dispatch(inputs)

    def act(self, seen: Observed, plan: DispatchPlan, now: dt.datetime, tripped: str | None) -> None:
        """Pause, resume and promote the shards the plan names, cut new ones, add the finalize shard.
        `tripped`: as for `plan` (set too while the written condition holds: `error_threshold_condition`
        keeps it)."""
        hold = "campaign suspended (spec.suspend)" if seen.campaign.spec.suspend else "budget exhausted"
        if not seen.campaign.spec.suspend and tripped is not None:
            hold = "error threshold reached (condition ErrorThreshold)"
        for name in plan.pause:
            self.writes.transition_named(seen, name, TransitionRequest(Action.PAUSE, f"paused: {hold}"), now)
        for name in plan.resume:
            self.writes.transition_named(
                seen, name, TransitionRequest(Action.RESUME, "resumed: nothing holds it"), now
            )
        for name in plan.promote:
            self.writes.transition_named(seen, name, TransitionRequest(Action.MATERIALIZE, "claimable"), now)
        self.materialize(seen, plan.materialize, now)
        self.finalize(seen, now)

    def materialize(self, seen: Observed, count: int, now: dt.datetime) -> None:
        """Cut the next `count` shards (FIFO by item index) and make them Pending.

        The creates go one after another in index order, so a pass stopped anywhere leaves no gap
        below the highest shard cut (`observe.item_progress` counts the cut from it). Each new
        shard's Pending write goes alongside the next create (`alongside`), which halves what a
        pass spends cutting (two round trips a shard, one after the other, before), and the pass
        waits for them all before it goes on; a write that fails stops the creates. A shard whose
        Pending write did not happen (the pass stopped) is Queued, and the next pass promotes it."""
        if count <= 0:
            return
        progress = observe.item_progress(seen.campaign, seen.shards.values(), len(seen.items))
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
                shard = self.writes.create(seen, body)
                if shard is None:
                    break
                message = f"items {start}..{end - 1} of {len(seen.items)}"
                request = TransitionRequest(Action.MATERIALIZE, message)
                writes.append(self.alongside.submit(self.writes.transition, seen, shard, request, now))
        finally:
            futures.wait(writes)
        for write in writes:
            write.result()  # the first failure, as the pass would have met it

    def finalize(self, seen: Observed, now: dt.datetime) -> None:
        """Cut the finalize shard once every work shard is cut and finished, when the budget allows."""
        campaign = seen.campaign
        spec = campaign.spec
        if spec.finalize is None or shardview.finalize_name(campaign.name) in seen.shards:
            return
        if observe.item_progress(campaign, seen.shards.values(), len(seen.items)).uncut_shards:
            return
        work = [s for s in seen.shards.values() if s.spec.shard_class is ShardClass.WORK]
        if not all(shardview.phase_of(s).terminal for s in work):
            return
        if spec.suspend or not allows(self._gate(seen), ShardClass.FINALIZE):
            return
        # The campaign's shape, not the live shards: folded work shards are gone from the listing.
        body = builders.finalize_shard_body(campaign, seen.items)
        shard = self.writes.create(seen, body)
        if shard is not None:
            note = f"all {len(work)} work shard(s) finished: the closing step may start"
            self.writes.transition(seen, shard, TransitionRequest(Action.MATERIALIZE, note), now)

    @staticmethod
    def _gate(seen: Observed) -> BudgetGate:
        views = [shardview.shard_view(s) for s in seen.shards.values()]
        return observe.campaign_budget(seen.campaign, views).gate

    def start_workers(self, seen: Observed, plan: DispatchPlan) -> None:
        """Start the planned worker Jobs (the planner already held them back where it had to)."""
        if not plan.start_workers:
            return
        waiting = waiting_for_sources(seen.campaign)
        if waiting:
            # A worker pod gets a shared Source's key from the status entry (builders.worker_job_body):
            # none before the sharing pass resolved the Source (seconds, or until it exists).
            log.info("%s: no worker yet, waiting for the shared source(s) %s", seen.campaign.name, waiting)
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
