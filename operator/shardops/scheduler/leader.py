"""Leader election through one coordination.k8s.io Lease: only the leader runs kopf and reconciles.

Why not kopf peering: with equal priorities every replica pauses and none reconciles, silently
(kopf issue #734). Here the rules are client-go's:

* The leader renews every `renew` seconds with a resourceVersion precondition and keeps acting only
  until the renew deadline (2/3 of the lease) after it *sent* its last successful renewal, so it
  stops before anyone may take over. Counting from the request, not from the answer, is what makes
  that hold: a standby measures its lease from when it saw the renewal, which is no earlier than
  when the renewal was written, which is no earlier than when it was sent, however late the answer
  came. (client-go takes the time after the answer, so a slow answer stretches its leadership.)
* Every write of a reconcile pass goes through `guard_write` (`Kube.guarded`): a monotonic-clock
  check, no API call, before each request and each retry of it. Past the deadline nothing more is
  sent and the pass stops; the rest of the lease (1/3, 5 s by default) is the margin for a write
  sent just before the deadline to land before a standby may take over. The bound: after the
  deadline, at most the one request each reconcile thread already has on its way can still land
  (within the request timeout of when it was sent).
* A standby takes the Lease once it has watched it stay unchanged for a whole lease duration
  (measured on its own monotonic clock, so clock skew between nodes does not matter), or at once when
  it is released. Takeover after a leader dies: at most lease + retry seconds.
* A restarted container takes the Lease at once when it was held under its own name by its own
  pod's previous container: the holder records "<pod uid>/<process token>" in an annotation, and a
  pod runs one container of the operator at a time (the kubelet starts the next only after the last
  exited), so a holder with this pod's uid and another token is dead. Two pods never share a uid, so
  two replicas misconfigured with one name still wait (and are reported, below).
* A write of the Lease whose answer was lost (applied, then answered with a 5xx, a timeout, a
  closed connection, or the 409 of a copy urllib3 sent again on its own) is recognised at the next
  look by what only this process writes: the renewTime it sent, under its identity and its instance
  annotation. Taken for another process renewing under its name, it would make the leader step down
  and exit; a lost acquisition would be waited out as a live holder's. Leading counts from that
  write's request, as for an answered one.
* Nothing freezes silently: a leader that cannot renew, a replica that cannot read the Lease, a Lease
  renewed under our own identity by another process (two replicas with one name), and a blocked
  event loop are each logged, counted in `shardops_leader_election_problems_total`, reported as an
  Event on the Lease, and make /healthz fail so the pod is restarted. A leader whose event loop is
  blocked stops renewing, so a healthy standby takes over.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from shardops.api.common import JSON
from shardops.api.names import LEADER_INSTANCE_ANNOTATION
from shardops.clock import utcnow
from shardops.k8s import events
from shardops.k8s.api import LEASES, AlreadyExists, Conflict, Kube, NotFound, WriteRefused
from shardops.logic.leases import is_expired
from shardops.logic.timefmt import micro_time
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.settings import REPORTING_CONTROLLER, OperatorSettings

log = logging.getLogger(__name__)


class Problem(StrEnum):
    RENEWAL_FAILED = "RenewalFailed"
    LEASE_UNREADABLE = "LeaseUnreadable"
    DUPLICATE_IDENTITY = "DuplicateIdentity"
    LOOP_STALLED = "EventLoopStalled"
    LEADERSHIP_LOST = "LeadershipLost"


# How many writes of the Lease whose answer was lost are kept for recognition.
UNANSWERED_KEPT = 8


@dataclass(frozen=True)
class _Unanswered:
    """A write of the Lease by this process whose outcome is open: the renewTime it sent, when it
    was sent (monotonic), and who held the Lease before it (for an acquisition's Event)."""

    renew_time: str
    sent: float
    previous: str | None = None


@dataclass
class _Seen:
    """The Lease version a standby last saw, and when (monotonic) it first saw it."""

    resource_version: str
    since: float


def lease_body(
    name: str, identity: str, instance: str, seconds: int, transitions: int, now: dt.datetime
) -> JSON:
    stamp = micro_time(now)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "annotations": {LEADER_INSTANCE_ANNOTATION: instance}},
        "spec": {
            "holderIdentity": identity,
            "leaseDurationSeconds": seconds,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        },
    }


def lease_expired(seen: _Seen, holder: str | None, duration: float, mono_now: float) -> bool:
    """Free when nobody holds it, or when it has not changed for a whole lease duration (the one
    expiry rule, `logic.leases.is_expired`, on this process's clock)."""
    return not holder or is_expired(mono_now - seen.since, duration)


def process_instance(pod_uid: str | None) -> str:
    """This process's mark in the leader Lease: "<pod uid>/<token>" (just the token outside a pod)."""
    token = uuid.uuid4().hex[:16]
    return f"{pod_uid}/{token}" if pod_uid else token


def held_by_dead_predecessor(lease: JSON, holder: str | None, identity: str, instance: str) -> bool:
    """The Lease is held under our name by an earlier container of our own pod: that process is gone."""
    pod_uid, sep, _ = instance.rpartition("/")
    if holder != identity or not sep:
        return False
    recorded = ((lease.get("metadata") or {}).get("annotations") or {}).get(LEADER_INSTANCE_ANNOTATION) or ""
    return recorded.startswith(f"{pod_uid}/") and recorded != instance


class LeaderElector:
    """Run `run(stop)` on a thread; ask `is_leader()` before acting."""

    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        metrics: Metrics,
        *,
        loop_healthy: Callable[[], bool] = lambda: True,
        on_lost: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.identity = settings.identity
        self.instance = process_instance(settings.pod_uid)
        self.loop_healthy = loop_healthy
        self.on_lost = on_lost
        self.clock = clock
        self.wall = wall
        self.namespace = settings.leader_election_namespace
        self.name = settings.leader_election_lease_name
        self.leading = False
        self.holder: str | None = None
        self._lock = threading.Lock()
        self._leader_until = 0.0
        self._my_version: str | None = None
        self._seen: _Seen | None = None
        self._last_read_ok = clock()
        self._last_step = clock()
        self._renewal_failing = False
        # Writes of the Lease sent since the last answered one whose answer was lost.
        self._unanswered: list[_Unanswered] = []
        self._reported: set[Problem] = set()
        self.became_leader = threading.Event()
        metrics.is_leader.labels(identity=self.identity).set(0)
        metrics.leader_known.labels(identity=self.identity).set(0)

    # --- queries ----------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        with self._lock:
            return self.leading and self.clock() < self._leader_until

    def guard_write(self, method: str, path: str) -> None:
        """Before each write of a reconcile pass (and each retry of it): refuse it unless this
        replica still leads, inside the renew deadline of its last renewal request."""
        if not self.is_leader():
            raise WriteRefused(
                f"{self.identity} no longer leads (no renewal sent within the last "
                f"{self.settings.renew_deadline_seconds:.0f}s succeeded): {method} {path} not sent"
            )

    def renewing(self) -> bool:
        """False while the leader's renewals fail (it still leads until the deadline)."""
        return self.is_leader() and not self._renewal_failing

    def health(self) -> tuple[bool, str]:
        now = self.clock()
        step_age = now - self._last_step
        limit = (
            max(self.settings.leader_election_retry_seconds, self.settings.leader_election_renew_seconds) * 3
            + 30
        )
        if step_age > limit:
            return False, f"leader election thread has not run for {step_age:.0f}s"
        unknown = now - self._last_read_ok
        if unknown > 3 * self.settings.leader_election_lease_seconds:
            return False, f"cannot tell who leads: leader Lease unreadable for {unknown:.0f}s"
        if Problem.DUPLICATE_IDENTITY in self._reported:
            return False, f"another process renews the leader Lease as {self.identity}"
        role = "leader" if self.is_leader() else f"standby (leader: {self.holder or 'none'})"
        return True, role

    # --- the loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        log.info("leader election: %s competes for Lease %s/%s", self.identity, self.namespace, self.name)
        while not stop.is_set():
            try:
                wait = self.step()
            except Exception:
                # The thread must outlive any one bad look: a dead election thread is a silent freeze.
                log.exception("leader election: unexpected error; trying again")
                self.metrics.leader_problems.labels(identity=self.identity, kind="UnexpectedError").inc()
                wait = self.settings.leader_election_retry_seconds
            stop.wait(wait)

    def step(self) -> float:
        """One look at the Lease: renew, acquire or wait. Returns seconds until the next look."""
        self._last_step = self.clock()
        try:
            lease = self.kube.get(LEASES, self.namespace, self.name)
        except NotFound:
            lease = None
        except Exception as error:  # any failure to read is: cannot tell who leads
            return self._unreadable(error)
        self._read_ok()
        if lease is None:
            self._create()
            return self._next_wait()
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or None
        version = str(lease["metadata"]["resourceVersion"])
        self.holder = holder
        if self.leading:
            self._as_leader(lease, holder, version)
        else:
            self._as_standby(lease, holder, version)
        return self._next_wait()

    def _next_wait(self) -> float:
        if self.leading and not self._renewal_failing:
            return self.settings.leader_election_renew_seconds
        return self.settings.leader_election_retry_seconds

    def _own_write(self, lease: JSON) -> _Unanswered | None:
        """The write of ours whose answer was lost that `lease` shows (None: it shows none): our
        identity, our instance, and the renewTime only that write sent."""
        spec = lease.get("spec") or {}
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        if spec.get("holderIdentity") != self.identity:
            return None
        if annotations.get(LEADER_INSTANCE_ANNOTATION) != self.instance:
            return None
        return next((w for w in self._unanswered if w.renew_time == spec.get("renewTime")), None)

    def _answer_lost(self, body: JSON, sent: float, previous: str | None) -> None:
        """Keep a write that failed, for the next look to recognise if it was applied all the same.
        Any failure may hide one: a 5xx, a timeout, a closed connection, and even a plain 409 — the
        answer to the copy of a PUT that urllib3 sends again on its own after the connection closed
        (`Kube` never sees the first). Recognition asks for the renewTime only this write sent, so
        keeping a write that was refused costs nothing."""
        renew_time = str((body.get("spec") or {}).get("renewTime") or "")
        # The last few: a write whose answer was lost lands at once or not at all (the renew
        # deadline, or the next acquisition, comes long before an older one could).
        self._unanswered = [
            *self._unanswered[-(UNANSWERED_KEPT - 1) :],
            _Unanswered(renew_time, sent, previous),
        ]

    def _as_leader(self, lease: JSON, holder: str | None, version: str) -> None:
        if version != self._my_version and (own := self._own_write(lease)) is not None:
            log.info("leader election: the renewal whose answer was lost was applied (%s)", version)
            with self._lock:
                self._my_version = version
                self._leader_until = max(self._leader_until, own.sent + self.settings.renew_deadline_seconds)
            self._unanswered.clear()
        if holder != self.identity or version != self._my_version:
            if holder == self.identity:
                self._problem(
                    Problem.DUPLICATE_IDENTITY,
                    f"the leader Lease was renewed as {self.identity} by another process: two replicas share "
                    "one identity (set POD_NAME from metadata.name); stepping down",
                    lease,
                )
            self._lose(f"Lease now held by {holder or 'nobody'}")
            return
        if not self.loop_healthy():
            self._problem(
                Problem.LOOP_STALLED,
                f"{self.identity}'s event loop is blocked: not renewing, so a healthy replica takes over",
                lease,
            )
            self._check_deadline()
            return
        # The deadline counts from now, before the request: see the module docstring.
        sent = self.clock()
        patch = {"spec": {"renewTime": micro_time(self.wall()), "holderIdentity": self.identity}}
        try:
            renewed = self.kube.patch(LEASES, self.namespace, self.name, patch, resource_version=version)
        except Conflict:
            # Changed between our read and write (or our own write, its answer lost): the next look
            # decides who holds it.
            self._answer_lost(patch, sent, self.identity)
            self._renewal_failed("the Lease changed under us", lease)
            return
        except Exception as error:
            self._answer_lost(patch, sent, self.identity)
            self._renewal_failed(str(error), lease)
            return
        self._unanswered.clear()
        with self._lock:
            self._my_version = str(renewed["metadata"]["resourceVersion"])
            self._leader_until = sent + self.settings.renew_deadline_seconds
        if self._renewal_failing:
            log.info("leader election: renewals of %s work again", self.identity)
        self._renewal_failing = False
        self._reported.discard(Problem.RENEWAL_FAILED)

    def _as_standby(self, lease: JSON, holder: str | None, version: str) -> None:
        now = self.clock()
        own = self._own_write(lease)
        if own is not None:
            log.info("leader election: the acquisition whose answer was lost was applied")
            self._won(lease, previous=own.previous, sent=own.sent)
            return
        if held_by_dead_predecessor(lease, holder, self.identity, self.instance):
            log.info("leader election: the Lease is held by this pod's previous container; taking it over")
            self._take_over(lease, holder)
            return
        if self._seen is None or self._seen.resource_version != version:
            if self._seen is not None and holder == self.identity:
                self._problem(
                    Problem.DUPLICATE_IDENTITY,
                    f"the leader Lease is being renewed as {self.identity} by another process: two replicas "
                    "share one identity (set POD_NAME from metadata.name); not taking over",
                    lease,
                )
            self._seen = _Seen(version, now)
        duration = float(
            (lease.get("spec") or {}).get("leaseDurationSeconds")
            or self.settings.leader_election_lease_seconds
        )
        if not lease_expired(self._seen, holder, duration, now):
            return
        self._take_over(lease, holder)

    def _take_over(self, lease: JSON, holder: str | None) -> None:
        """Replace the Lease at the version we read: whoever wrote it since wins, and we look again."""
        transitions = int((lease.get("spec") or {}).get("leaseTransitions") or 0) + 1
        body = lease_body(
            self.name,
            self.identity,
            self.instance,
            self.settings.leader_election_lease_seconds,
            transitions,
            self.wall(),
        )
        annotations = {**(lease["metadata"].get("annotations") or {}), **body["metadata"]["annotations"]}
        body["metadata"] = {**lease["metadata"], "annotations": annotations}
        sent = self.clock()
        try:
            taken = self.kube.replace(LEASES, self.namespace, self.name, body)
        except Conflict:
            self._answer_lost(body, sent, holder)
            return
        except Exception as error:
            self._answer_lost(body, sent, holder)
            log.warning("leader election: taking over the Lease failed: %s", error)
            return
        self._won(taken, previous=holder, sent=sent)

    def _create(self) -> None:
        seconds = self.settings.leader_election_lease_seconds
        body = lease_body(self.name, self.identity, self.instance, seconds, 0, self.wall())
        sent = self.clock()
        try:
            created = self.kube.create(LEASES, self.namespace, body)
        except AlreadyExists:
            self._answer_lost(body, sent, None)
            return
        except Exception as error:
            self._answer_lost(body, sent, None)
            log.warning("leader election: creating the Lease failed: %s", error)
            return
        self._won(created, previous=None, sent=sent)

    def _won(self, lease: JSON, previous: str | None, sent: float) -> None:
        """The Lease is ours, written by the request sent at `sent` (monotonic)."""
        self._unanswered.clear()
        with self._lock:
            self.leading = True
            self._my_version = str(lease["metadata"]["resourceVersion"])
            self._leader_until = sent + self.settings.renew_deadline_seconds
        self.holder = self.identity
        self._renewal_failing = False
        self.metrics.is_leader.labels(identity=self.identity).set(1)
        note = f"{self.identity} leads" + (f", taking over from {previous}" if previous else "")
        log.info("leader election: %s", note)
        self._event(lease, "LeaderElected", note, warning=False)
        self.became_leader.set()

    def _renewal_failed(self, why: str, lease: JSON) -> None:
        self._renewal_failing = True
        self._problem(
            Problem.RENEWAL_FAILED, f"{self.identity} could not renew the leader Lease: {why}", lease
        )
        self._check_deadline()

    def _check_deadline(self) -> None:
        if self.leading and self.clock() >= self._leader_until:
            self._lose("no successful renewal within the renew deadline")

    def _lose(self, why: str) -> None:
        self._unanswered.clear()
        with self._lock:
            was = self.leading
            self.leading = False
            self._leader_until = 0.0
        self.metrics.is_leader.labels(identity=self.identity).set(0)
        if was:
            self.metrics.leader_problems.labels(
                identity=self.identity, kind=str(Problem.LEADERSHIP_LOST)
            ).inc()
            log.error("leader election: %s lost the leadership (%s); stopping", self.identity, why)
            self.on_lost()

    def _unreadable(self, error: BaseException) -> float:
        self.metrics.leader_known.labels(identity=self.identity).set(0)
        unknown = self.clock() - self._last_read_ok
        if unknown >= self.settings.leader_election_lease_seconds:
            self._problem(
                Problem.LEASE_UNREADABLE,
                f"{self.identity} cannot tell who leads: the leader Lease has been unreadable for "
                f"{unknown:.0f}s ({error})",
                None,
            )
        else:
            log.warning("leader election: reading the Lease failed: %s", error)
        if self.leading:
            self._renewal_failing = True
            self._check_deadline()
        return self.settings.leader_election_retry_seconds

    def _read_ok(self) -> None:
        self._last_read_ok = self.clock()
        self.metrics.leader_known.labels(identity=self.identity).set(1)
        self._reported.discard(Problem.LEASE_UNREADABLE)

    def _problem(self, kind: Problem, message: str, lease: JSON | None) -> None:
        """Log and count every time; post an Event once per episode so a stuck replica is visible in
        `kubectl get events` without flooding it."""
        self.metrics.leader_problems.labels(identity=self.identity, kind=str(kind)).inc()
        log.error("leader election: %s", message)
        if kind in self._reported:
            return
        self._reported.add(kind)
        if lease is not None:
            self._event(lease, str(kind), message, warning=True)

    def _event(self, lease: JSON, reason: str, note: str, *, warning: bool) -> None:
        target = {**lease, "apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
        target["metadata"] = {**(lease.get("metadata") or {}), "namespace": self.namespace}
        body = events.event_body(
            target,
            reason=reason,
            note=note,
            action="LeaderElection",
            controller=REPORTING_CONTROLLER,
            instance=self.identity,
            now=self.wall(),
            warning=warning,
        )
        events.record(self.kube, body)

    def release(self) -> None:
        """On a graceful stop: hand the Lease back so a standby takes over at once, not after a lease."""
        with self._lock:
            if not self.leading or self._my_version is None:
                return
            self.leading = False
            version = self._my_version
        self.metrics.is_leader.labels(identity=self.identity).set(0)
        try:
            self.kube.patch(
                LEASES,
                self.namespace,
                self.name,
                {"spec": {"holderIdentity": None, "renewTime": None, "acquireTime": None}},
                resource_version=version,
            )
            log.info("leader election: %s released the Lease", self.identity)
        except Exception as error:
            log.warning("leader election: releasing the Lease failed: %s", error)
