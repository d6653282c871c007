"""A claimed shard as its holder sees it (`Holding`): what the claim holds, every write made as its
holder, and the endings of the attempt. `ShardRun` (shardrun.py) runs the command on top of it.

A Holding sees the slot that claimed the shard through `Slot`: only what it uses of the worker.

Outcomes of one claimed shard:

* reused: a verified result is already stored under the idempotency key -> Done, command not run;
* done: every item has a result (stored earlier or by this attempt) -> Done with result
  {ref, fingerprint, bytes};
* failed: the command failed, or its output, cost or size broke a rule -> Pending with notBefore,
  Failed or Blocked, as logic.errors decides;
* released: SIGTERM; the command was stopped and partial results flushed -> Pending, attempt not
  charged;
* fenced: the Lease or the shard is not ours any more -> untouched, the new holder owns it;
* abandoned: trouble mid-shard and nothing could be written -> the Lease runs out, the shard is
  reclaimed as a zombie.

Partial results survive a crash up to the last heartbeat: each heartbeat flushes the item results
read since the previous one to the result store. Items a killed worker finished after its last
flush are computed again by the next attempt.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

import urllib3

from shardops.api.campaign import Campaign
from shardops.api.enums import ErrorClass, ShardPhase, StoreType
from shardops.api.money import money_text
from shardops.api.shard import Shard, ShardError, ShardResult
from shardops.k8s import leases
from shardops.k8s.api import CAMPAIGNS, SHARDS, ApiError, KubeClient, NotFound
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.logic.backoff import retry_not_before
from shardops.logic.failures import next_phase_after_failure
from shardops.logic.transitions import Action
from shardops.store import ResultStore
from shardops.store.finished import commit_for_reuse
from shardops.store.records import (
    ResultMeta,
    ResultTooLarge,
    StoreCorrupt,
    StoredResult,
    StoreUnavailable,
    encode_result,
)
from shardops.worker import heartbeat
from shardops.worker.claim import Claimed
from shardops.worker.clocks import Clock
from shardops.worker.heartbeat import Fenced, FenceReason
from shardops.worker.logs import emit, log
from shardops.worker.metrics import WorkerMetrics
from shardops.worker.persistent import CommandServer
from shardops.worker.settings import WorkerSettings
from shardops.worker.tally import Tally

T = TypeVar("T")

# API trouble that a later try may not have: keep the claim, try again next tick.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ApiError,
    urllib3.exceptions.HTTPError,
    OSError,
    StoreUnavailable,
)


class Outcome(StrEnum):
    """How a claimed shard ended (module docstring)."""

    REUSED = "reused"
    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"
    FENCED = "fenced"
    ABANDONED = "abandoned"


class Slot(Protocol):
    """What a claimed shard's run sees of the slot that claimed it (runtime.Worker): its API client,
    settings, clocks and identity, its process's metrics and persistent command, its stop."""

    @property
    def kube(self) -> KubeClient: ...
    @property
    def settings(self) -> WorkerSettings: ...
    @property
    def namespace(self) -> str: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def stop(self) -> threading.Event: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    @property
    def commands(self) -> CommandServer: ...
    @property
    def holder(self) -> str: ...
    @property
    def actor(self) -> Actor: ...

    def store_for(self, campaign: Campaign) -> ResultStore:
        """The result store the campaign's status names."""
        ...

    def wait(self, seconds: float) -> bool:
        """Sleep unless stopped; True when a stop was requested."""
        ...


@dataclass
class Holding:
    """One claimed shard as its holder sees it, from claim to outcome: the latest shard object (its
    resourceVersion is the precondition of our next write), the Lease claim, the item results known,
    and every write made as the holder (heartbeat, transitions, and the endings: `complete`, `fail`,
    `release`). What runs the command is ShardRun's (shardrun.py)."""

    slot: Slot
    campaign: Campaign
    claimed: Claimed
    shard: Shard = field(init=False)
    lease: leases.Claim = field(init=False)
    # The shard's items and the results known for them, its cost so far (tally.py).
    tally: Tally = field(init=False)
    # The class of the failure this run recorded (fail()), for shardops_worker_shards_total.
    error_class: ErrorClass | None = None
    # The shard result this run stored, once it is stored: from then on the shard is finished.
    stored_result: StoredResult | None = None

    def __post_init__(self) -> None:
        self.shard = self.claimed.shard
        self.lease = self.claimed.lease
        budget = self.campaign.spec.budget
        self.tally = Tally(
            list(self.claimed.items),
            dict(self.claimed.stored),
            self.shard.current_status.cost,
            self.shard.current_status.tokens,
            cap=budget.max_per_shard if budget else None,
        )
        self.attempt = max(self.shard.current_status.attempt, 1)
        self.key = self.shard.spec.idempotency_key
        self.kube = self.slot.kube
        self.settings = self.slot.settings
        self.clock = self.slot.clock
        self.store = self.slot.store_for(self.campaign)

    # --- bookkeeping ------------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        return self.slot.namespace

    @property
    def name(self) -> str:
        return self.shard.name

    # --- writes as the holder ---------------------------------------------------------------------

    def renew(self) -> None:
        self.lease = heartbeat.renew(self.kube, self.lease, self.clock.now())

    def flush(self) -> int:
        """Store the item results read since the last flush (only new ones)."""
        if not self.tally.fresh:
            return 0
        written = self.store.save_items(
            self.key, self.campaign.name, self.tally.fresh, shard=self.name, token=self.lease.fencing_token
        )
        self.tally.mark_stored()
        return written

    def flush_if_possible(self) -> None:
        """Before handing the shard back: keep what can be kept, but never let the store stop the
        hand-back. Results not stored are computed again by the next attempt."""
        try:
            self.flush()
        except ResultTooLarge:
            # The partial results alone are over the cap: keep nothing rather than part of them.
            self.tally.fresh = {}
        except TRANSIENT_ERRORS as error:
            log.warning("%s: could not store %d item result(s): %s", self.name, len(self.tally.fresh), error)
            self.tally.fresh = {}

    def heartbeat(self) -> None:
        self.renew()
        self.flush()
        patch = heartbeat.heartbeat_patch(
            self.attempt,
            self.tally.progress(),
            self.tally.cost(),
            self.clock.now(),
            self.lease.until,
            self.tally.tokens(),
        )
        self.shard = heartbeat.write_as_holder(
            self.kube,
            self.shard,
            self.slot.holder,
            self.lease.fencing_token,
            lambda shard: heartbeat.patch_heartbeat(self.kube, shard, patch),
        )

    def transition(self, request: TransitionRequest) -> None:
        now = self.clock.now()
        self.shard = heartbeat.write_as_holder(
            self.kube,
            self.shard,
            self.slot.holder,
            self.lease.fencing_token,
            lambda shard: apply_transition(self.kube, shard, request, self.slot.actor, now),
        )

    def _errored_items_error(self, index: int, error: Mapping[str, Any]) -> ShardError:
        """A Done shard's lastError when some of its items errored: how many, and the first one's."""
        count = self.tally.complete().errored or 0
        return ShardError(
            error_class=ErrorClass(str(error.get("class"))),
            source=self.claimed.source,
            message=(
                f"{count} of {len(self.tally.keys)} item(s) failed on their own and were recorded as "
                f"errored (kubectl campaign results --failed); the first (item {index} of the shard): "
                f"{error.get('message')}"
            ),
            at=self.clock.now(),
        )

    def _leaving(self) -> dict[str, Any]:
        """Fields every exit from Running clears or settles: the claim goes, progress and cost stay."""
        return {
            "owner": None,
            "lease_until": None,
            "fencing_token": None,
            "progress": self.tally.progress(),
            "cost": self.tally.cost(),
            "tokens": self.tally.tokens(),
        }

    def release_lease(self) -> None:
        if not leases.release(self.kube, self.lease):
            log.warning("%s: the Lease was no longer ours when releasing it", self.name)

    # --- endings ----------------------------------------------------------------------------------

    def with_store(self, what: str, call: Callable[[], T]) -> T:
        """`call`, retried while the store is unreachable, keeping the claim (renewing the Lease)
        for up to SHARDOPS_STORE_RETRY_SECONDS; then StoreUnavailable propagates."""
        deadline = self.clock.monotonic() + self.settings.store_retry_seconds
        while True:
            try:
                return call()
            except StoreUnavailable as error:
                if self.clock.monotonic() >= deadline or self.slot.stop.is_set():
                    raise
                log.warning("%s: %s failed, retrying: %s", self.name, what, error)
            self.slot.wait(self.settings.poll_seconds)
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
        errored = self.tally.first_errored()
        updates = {
            **self._leaving(),
            **({"last_error": self._errored_items_error(*errored)} if errored is not None else {}),
            # A rerun of the errored items none of which errored again: its errored lastError is gone.
            **({"last_error": None} if errored is None and self.shard.current_status.rerun_errored else {}),
            "progress": self.tally.complete(),
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
            cost=money_text(self.tally.cost()),
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
        still stands (same uid) is deleted only when folded, which only a finished shard is (Done,
        or given up, which while our Lease holds only we could have written): gone, our write was
        applied too. (A deleted campaign also deletes its shards: that stays a fencing,
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
        entries, costs = self.tally.entries()
        text = encode_result(self.key, entries, costs)
        meta = ResultMeta(
            self.campaign.name, self.name, self.slot.holder, self.attempt, self.lease.fencing_token
        )
        return self.with_store(
            "storing the result", lambda: self.store.store_result(self.key, text, meta, len(entries))
        )

    def verified_result(self) -> StoredResult | None:
        """The shard's result if it is stored and verifies: the one this run stored, else the key's
        (one read). Trouble reading it counts as none."""
        if self.stored_result is not None:
            return self.stored_result
        if self.shard.current_status.rerun_errored:
            return None  # the key's stored result is the one whose errored items this attempt reruns
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
                self.slot.rng.random(),
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
        done = self.tally.progress()
        message = f"released by {self.slot.holder} on shutdown with {done.done}/{done.total} item(s) stored"
        self.transition(TransitionRequest(Action.RELEASE, message, updates=self._leaving()))
        ended = time.time()
        self.release_lease()
        emit("released", shard=self.name, attempt=self.attempt, stored=done.done, total=done.total, at=ended)
        return Outcome.RELEASED
