"""The lease sweep (`Sweeper`): the heartbeat table of `logic.leases` for every Running shard.

Zombies (their claim expired) go back to Pending, or to Done when their stored result verifies;
stuck shards (no progress for the stall window) are reported, and revoked or blocked as the stall
policy says. What the sweep found (`Sweep`) feeds the status write (the Stalled condition); the
Stalled Events go out only after that write (`announce`)."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

from shardops.api.common import JSON
from shardops.api.enums import ErrorClass, ShardPhase
from shardops.api.shard import Shard, ShardError
from shardops.k8s import campaigns, events, leases
from shardops.k8s.api import KubeClient
from shardops.k8s.shards import TransitionRequest
from shardops.logic.leases import LeaseVerdict, classify_lease, lease_action
from shardops.logic.transitions import EventReason
from shardops.scheduler.memory import Memory, Progress
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.observed import Observed
from shardops.scheduler.writes import ShardWrites
from shardops.state import shardview
from shardops.store import ResultStore
from shardops.store.finished import commit_for_reuse, completion, stored_result_of
from shardops.store.installation import Stores
from shardops.store.records import StoredResult, StoreUnavailable

log = logging.getLogger(__name__)


@dataclass
class Sweep:
    """What the lease sweep found: the stuck shards (the Stalled condition) and the stuck attempts
    not announced yet (shard, attempt, why), announced after the status write."""

    stuck: list[str] = field(default_factory=list)
    to_announce: list[tuple[Shard, int, str]] = field(default_factory=list)


class Sweeper:
    def __init__(
        self,
        kube: KubeClient,
        writes: ShardWrites,
        stores: Stores,
        metrics: Metrics,
        series: events.EventSeries,
    ) -> None:
        self.kube = kube
        self.series = series
        self.writes = writes
        self.stores = stores
        self.metrics = metrics

    def sweep(self, seen: Observed, memory: Memory, now: dt.datetime) -> Sweep:
        """Judge every Running shard's claim; returns the shards found stuck, and those of them to
        announce once the status says they are stalled."""
        spec = seen.campaign.spec
        found = Sweep()
        running = {n for n, s in seen.shards.items() if shardview.phase_of(s) is ShardPhase.RUNNING}
        for gone in set(memory.progress) - running:
            del memory.progress[gone]
        # Bounded by the window: the Running shards of this pass.
        memory.renewals.keep_only({seen.shards[n].lease_name for n in running})
        for name in sorted(running):
            shard = seen.shards[name]
            status = shard.current_status
            mark = progress_mark(memory, shard, now)
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
                found.stuck.append(name)
                if not mark.reported:
                    found.to_announce.append((shard, attempt, verdict.reason))
            action = lease_action(verdict.verdict, spec.stall.policy, attempt, spec.max_attempts)
            if action is None:
                continue
            zombie = verdict.verdict is LeaseVerdict.ZOMBIE
            try:
                finished = self.finished_result(seen, shard) if zombie else None
            except StoreUnavailable as unavailable:
                log.warning("%s: cannot look for its stored result, judging it later: %s", name, unavailable)
                continue
            held = lease is not None and bool((lease.get("spec") or {}).get("holderIdentity"))
            if held and lease is not None and not leases.revoke(self.kube, lease):
                continue  # renewed since we read it: alive after all
            if finished is not None:
                # A zombie whose result verifies finished its work: Done, never charged or Blocked;
                # then its result is committed for reuse, as the worker that completes one does.
                store, stored = finished
                done = completion(shard, stored, f"{verdict.reason}; completed by the operator")
                completed = self.writes.transition(seen, shard, done, now)
                if not completed and held:
                    completed = self.writes.transition_claim(seen, shard, done, now)
                if completed:
                    commit_for_reuse(store, shard, stored)
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
            if not self.writes.transition(seen, shard, request, now) and held:
                # The Lease is taken back, so its holder is fenced (its next renewal fails), but a write
                # it had already sent moved the shard: record the action on the shard as it is now, or
                # the next pass would find a Lease without a holder and call it an expired lease.
                self.writes.transition_claim(seen, shard, request, now)
        return found

    def finished_result(self, seen: Observed, shard: Shard) -> tuple[ResultStore, StoredResult] | None:
        """The zombie's result, with its store, if it is stored and verifies (at most two store
        reads); None also when the operator cannot read the campaign's store (its own
        credentialsSecret): a worker taking the expired Lease over looks it up then
        (`store.finished`)."""
        store = self.stores.results(self.kube, seen.campaign)
        stored = None if store is None else stored_result_of(store, shard)
        return None if store is None or stored is None else (store, stored)

    def announce(self, seen: Observed, memory: Memory, found: Sweep, now: dt.datetime) -> None:
        """After the status write whose Stalled condition names them: the newly stuck attempts
        counted once each (until their progress moves again) in the campaign's one Stalled Event,
        one write a pass whatever their number (`events.EventSeries`, as the failures). Its note,
        written once, names the first; the Stalled condition names those stuck now."""
        policy = seen.campaign.spec.stall.policy
        stuck: list[tuple[Shard, str]] = []
        for shard, attempt, reason in found.to_announce:
            mark = memory.progress.get(shard.name)
            if mark is None or mark.attempt != attempt or mark.reported:
                continue
            mark.reported = True
            stuck.append((shard, reason))
        if not stuck:
            return
        self.metrics.stalls.labels(campaign=seen.key).inc(len(stuck))
        first, reason = stuck[0]
        body = campaigns.series_event_body(
            seen.body,
            reason=EventReason.STALLED,
            note=f"shard {first.name} first, as many as the series counts: {reason}; stall policy {policy}",
            actor=self.writes.actor,
            now=now,
            warning=True,
        )
        self.series.add(self.kube, body, len(stuck), now)


def progress_mark(memory: Memory, shard: Shard, now: dt.datetime) -> Progress:
    """When the shard's progress last rose, as this process saw it (the stall clock)."""
    status = shard.current_status
    done = status.progress.done if status.progress is not None else 0
    attempt = max(status.attempt, 1)
    mark = memory.progress.get(shard.name)
    if mark is None or mark.attempt != attempt:
        # First sight of this attempt: still since now, on this process's clock — the claim's
        # own time is the holder's clock, which may run behind (`logic.leases`, "Whose clock").
        mark = Progress(attempt, done, now)
        memory.progress[shard.name] = mark
    elif done > mark.done:
        mark.done, mark.changed_at, mark.reported = done, now, False
    return mark
