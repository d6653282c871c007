"""Leader election on an in-memory Lease, with the clocks in the test's hand."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
import urllib3

from shardops.k8s.api import (
    CAMPAIGNS,
    EVENTS,
    JOBS,
    LEASES,
    SHARDS,
    AlreadyExists,
    ApiError,
    Conflict,
    Resource,
    WriteRefused,
)
from shardops.scheduler.leader import LeaderElector
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.reconcile import Reconciler
from tests.fakekube import LOST_ANSWERS, Call, LostAnswer
from tests.schedulerkit import NAMESPACE, T0, OperatorKube, campaign, put_campaign, settings

LEASE = 15


class Clock:
    """Monotonic seconds; the wall clock follows it from T0."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> dt.datetime:
        return T0 + dt.timedelta(seconds=self.t)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def elector(
    kube: OperatorKube, clock: Clock, identity: str, pod_uid: str | None = None, **kwargs: object
) -> LeaderElector:
    config = settings(
        identity=identity,
        pod_uid=pod_uid,
        leader_election_namespace=NAMESPACE,
        leader_election_lease_seconds=LEASE,
        leader_election_renew_seconds=5,
        leader_election_retry_seconds=2,
    )
    return LeaderElector(kube, config, Metrics(), clock=clock, wall=clock.wall, **kwargs)  # type: ignore[arg-type]


def holder(kube: OperatorKube) -> str | None:
    lease = kube.obj(LEASES, NAMESPACE, "shardops-operator")
    return None if lease is None else lease["spec"].get("holderIdentity")


def problems(kube: OperatorKube) -> list[str]:
    return [e["reason"] for e in kube.list(EVENTS, NAMESPACE)]


def test_first_replica_leads_and_the_second_stands_by(kube: OperatorKube, clock: Clock) -> None:
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    a.step()
    b.step()
    assert a.is_leader() and not b.is_leader()
    assert holder(kube) == "a" and b.holder == "a"
    assert problems(kube) == ["LeaderElected"]
    assert a.health() == (True, "leader") and b.health() == (True, "standby (leader: a)")


def test_a_renewing_leader_is_never_replaced(kube: OperatorKube, clock: Clock) -> None:
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    a.step()
    for _ in range(30):
        clock.t += 2
        if clock.t % 4 == 0:
            a.step()
        b.step()
    assert holder(kube) == "a" and a.is_leader() and not b.is_leader()


def test_standby_takes_over_one_lease_after_the_leader_went_silent(kube: OperatorKube, clock: Clock) -> None:
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    a.step()
    b.step()  # first sight of the lease version at t=0
    clock.t = LEASE - 0.1
    b.step()
    assert holder(kube) == "a"
    clock.t = LEASE
    b.step()
    assert holder(kube) == "b" and b.is_leader()
    lease = kube.obj(LEASES, NAMESPACE, "shardops-operator")
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1
    # The old leader finds out at its next look and stops.
    lost: list[bool] = []
    a.on_lost = lambda: lost.append(True)
    a.step()
    assert not a.is_leader() and lost == [True]


def test_leader_stops_at_the_renew_deadline_when_renewals_fail(kube: OperatorKube, clock: Clock) -> None:
    lost: list[bool] = []
    a = elector(kube, clock, "a", on_lost=lambda: lost.append(True))
    a.step()

    def refuse(_: object, verb: str, resource: Resource, name: str) -> None:
        if verb == "patch" and resource is LEASES:
            raise ApiError(503, "ServiceUnavailable", "etcd is down")

    kube.before.append(refuse)
    clock.t = 5
    a.step()
    assert a.is_leader() and not a.renewing(), "still inside the deadline, but known to be failing"
    clock.t = 9.9
    a.step()
    assert a.is_leader()
    clock.t = 10.0  # 2/3 of the lease: before any standby may take over
    a.step()
    assert not a.is_leader() and lost == [True]
    assert problems(kube).count("RenewalFailed") == 1, "one Event per episode"


def test_a_leader_with_a_blocked_event_loop_stops_renewing(kube: OperatorKube, clock: Clock) -> None:
    healthy = [True]
    a = elector(kube, clock, "a", loop_healthy=lambda: healthy[0])
    b = elector(kube, clock, "b")
    a.step()
    b.step()
    healthy[0] = False
    for t in range(2, LEASE + 1, 2):
        clock.t = t
        a.step()
        b.step()
    clock.t = LEASE
    b.step()
    assert holder(kube) == "b" and not a.is_leader()
    assert "EventLoopStalled" in problems(kube)


def test_two_replicas_with_one_identity_are_reported_not_silent(kube: OperatorKube, clock: Clock) -> None:
    first, twin = elector(kube, clock, "same"), elector(kube, clock, "same")
    first.step()
    twin.step()
    for t in range(5, 60, 5):
        clock.t = t
        first.step()
        twin.step()
    assert first.is_leader() and not twin.is_leader()
    ok, why = twin.health()
    assert not ok and "another process" in why
    assert "DuplicateIdentity" in problems(kube)


def test_a_restarted_container_takes_over_from_its_dead_predecessor_at_once(
    kube: OperatorKube, clock: Clock
) -> None:
    before = elector(kube, clock, "operator-0", pod_uid="uid-1")
    before.step()
    assert before.is_leader()
    # SIGKILLed: it never renews or releases. The kubelet starts the pod's container again.
    clock.t = 3
    after = elector(kube, clock, "operator-0", pod_uid="uid-1")
    after.step()
    assert after.is_leader(), "no need to wait out the lease of a process known to be gone"
    lease = kube.obj(LEASES, NAMESPACE, "shardops-operator")
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1
    assert lease["metadata"]["annotations"]["shardops.dev/leader-instance"] == after.instance
    assert problems(kube) == ["LeaderElected", "LeaderElected"]


@pytest.mark.parametrize(
    "uid",
    [pytest.param("uid-2", id="another pod with the same name"), pytest.param(None, id="no pod uid")],
)
def test_a_holder_with_our_name_that_may_be_alive_is_waited_out(
    kube: OperatorKube, clock: Clock, uid: str | None
) -> None:
    before = elector(kube, clock, "operator-0", pod_uid="uid-1")
    before.step()
    clock.t = 3
    other = elector(kube, clock, "operator-0", pod_uid=uid)
    other.step()
    assert not other.is_leader() and holder(kube) == "operator-0"
    clock.t = 3 + LEASE
    other.step()
    assert other.is_leader(), "after a whole lease unchanged it is free, as for any holder"


def test_release_hands_over_at_once(kube: OperatorKube, clock: Clock) -> None:
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    a.step()
    b.step()
    a.release()
    assert holder(kube) is None and not a.is_leader()
    clock.t = 1
    b.step()
    assert holder(kube) == "b"


def test_a_replica_that_cannot_read_the_lease_reports_it(kube: OperatorKube, clock: Clock) -> None:
    a = elector(kube, clock, "a")

    original_get = kube.get

    def failing_get(*args: object, **kwargs: object) -> dict:
        raise ApiError(503, "ServiceUnavailable", "down")

    kube.get = failing_get  # type: ignore[method-assign]
    for t in range(0, 3 * LEASE + 2, 2):
        clock.t = t
        a.step()
    ok, why = a.health()
    assert not ok and "cannot tell who leads" in why
    kube.get = original_get  # type: ignore[method-assign]
    a.step()
    assert a.health()[0] and a.is_leader()


# --- the deadline counts from the request, and writes stop at it ----------------------------------------


def _answered_late(
    kube: OperatorKube, clock: Clock, verb: str, delay: float, meanwhile: Callable[[], object]
) -> None:
    """The next `verb` of the leader Lease is applied at once but answered `delay` seconds later (a
    slow network or API server); `meanwhile` runs in between, when the write is visible to others."""
    original = getattr(kube, verb)

    def late(*args: object, **kwargs: object) -> object:
        setattr(kube, verb, original)
        result = original(*args, **kwargs)
        meanwhile()
        clock.t += delay
        return result

    setattr(kube, verb, late)


@pytest.mark.parametrize("verb", ["patch", "create"], ids=["renewal", "acquisition"])
def test_a_slow_answer_never_makes_two_leaders(kube: OperatorKube, clock: Clock, verb: str) -> None:
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    if verb == "patch":
        a.step()
        clock.t = 5
    sent = clock.t
    # The standby sees the new version as soon as it is written; its writer hears back 8 s later.
    _answered_late(kube, clock, verb, delay=8, meanwhile=b.step)
    a.step()
    assert holder(kube) == "a" and clock.t == sent + 8
    # From here on the leader cannot renew, and the standby waits out a lease from what it saw.
    kube.before.append(lambda _k, v, r, _n: _refuse_renewals_of(a, v, r))
    last_led = sent
    while holder(kube) != "b" or a.leading:
        clock.t += 0.5
        a.step()
        b.step()
        assert not (a.is_leader() and b.is_leader()), f"two leaders at t={clock.t}"
        last_led = clock.t if a.is_leader() else last_led
        assert clock.t < sent + 3 * LEASE, "the standby never took over"
    assert last_led < sent + 10, "the leader stopped within the renew deadline of sending its request"


def _refuse_renewals_of(candidate: LeaderElector, verb: str, resource: Resource) -> None:
    if verb == "patch" and resource is LEASES and candidate.leading:
        raise ApiError(503, "ServiceUnavailable", "etcd is slow")


def test_the_write_guard_refuses_every_write_past_the_deadline(kube: OperatorKube, clock: Clock) -> None:
    a = elector(kube, clock, "a")
    a.step()  # sent (and answered) at t=0: leads until 10, two thirds of the lease
    clock.t = 9.9
    a.guard_write("POST", "/apis/batch/v1/namespaces/ns/jobs")  # still leading: no error
    clock.t = 10.0
    with pytest.raises(WriteRefused, match="POST /apis/batch/v1/namespaces/ns/jobs"):
        a.guard_write("POST", "/apis/batch/v1/namespaces/ns/jobs")
    b = elector(kube, clock, "b")
    with pytest.raises(WriteRefused):
        b.guard_write("PATCH", "/x")


def test_a_pass_stops_writing_once_the_leadership_is_lost(kube: OperatorKube, clock: Clock) -> None:
    """Leadership lost in the middle of a pass (the renew deadline passed while it ran): the writes
    it had not sent yet (more shards, worker Jobs, Events, the status) are never sent."""
    put_campaign(kube, campaign(items=[{"id": i} for i in range(4)], maxConcurrency=4))
    a = elector(kube, clock, "a")
    a.step()
    kube.write_guard = a.guard_write
    lost_after: list[int] = []

    def deadline_passes(fake: OperatorKube, verb: str, resource: Resource, name: str) -> None:
        if verb == "create" and resource is SHARDS and not lost_after:
            clock.t += 11  # the election thread could not renew meanwhile
            lost_after.append(len(fake.writes()))

    kube.before.append(deadline_passes)
    operator = Reconciler(
        kube,
        settings(),
        Metrics(),
        is_leader=a.is_leader,
        clock=lambda: T0 + dt.timedelta(seconds=clock.t),
    )
    assert operator.reconcile(NAMESPACE, "camp") is True, "a pass that stops is not an error"
    assert lost_after, "the pass got as far as creating a shard"
    after = kube.writes()[lost_after[0] :]
    assert [(c.verb, c.plural) for c in after] == [("create", "shards")], (
        "the write already on its way lands; nothing is sent after it"
    )
    assert kube.list(JOBS, NAMESPACE) == [] and "phase" not in (
        kube.obj(CAMPAIGNS, NAMESPACE, "camp") or {}
    ).get("status", {})
    assert (
        operator.metrics.registry.get_sample_value(
            "shardops_reconcile_duration_seconds_count", {"outcome": "not-leader"}
        )
        == 1
    )


# --- writes of the leader Lease whose answer was lost ------------------------------------------------


def connection_closed(call: Call) -> BaseException:
    """The connection closed after the write was sent, with no answer (not retried for a PATCH)."""
    return urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError("closed"))


def resent_by_urllib3(call: Call) -> BaseException:
    """The connection closed after the write was applied; urllib3 sent it again on its own (its
    default Retry does for PUT and DELETE), and `Kube` sees only the copy's answer: a plain 409."""
    if call.verb == "create":
        return AlreadyExists(409, "AlreadyExists", f"{call.plural} {call.name!r} already exists")
    return Conflict(409, "Conflict", f"{call.plural} {call.name!r}: the object has been modified")


LOST = [
    *(pytest.param(answer, id=name) for name, answer in LOST_ANSWERS.items()),
    pytest.param(connection_closed, id="connection closed"),
    pytest.param(resent_by_urllib3, id="closed, sent again by urllib3: 409"),
]


def _leader_lease_write(verb: str) -> Callable[[Call], bool]:
    return lambda call: call.plural == LEASES.plural and call.verb == verb


@pytest.mark.parametrize("answer", LOST)
def test_a_renewal_applied_whose_answer_was_lost_keeps_the_leadership(
    kube: OperatorKube, clock: Clock, answer: LostAnswer
) -> None:
    """The renewal landed; only its answer was lost. At the next look the Lease shows the renewTime
    this process sent, under its own instance: its own write, not another process renewing under its
    name (which would make it step down and exit)."""
    lost: list[bool] = []
    a = elector(kube, clock, "a", on_lost=lambda: lost.append(True))
    a.step()
    answered = kube.lose_answers(_leader_lease_write("patch"), answer)
    clock.t = 5
    a.step()
    assert len(answered) == 1
    # Renewals fail from here on, so it leads on the applied renewal alone.
    kube.before.append(lambda _k, v, r, _n: _refuse_renewals_of(a, v, r))
    clock.t = 7
    a.step()
    assert a.is_leader() and not lost
    assert "DuplicateIdentity" not in problems(kube) and "LeadershipLost" not in problems(kube)
    # Sent at t=5, it leads until 15 (two thirds of the lease after it), and no longer.
    clock.t = 14.9
    a.step()
    assert a.is_leader() and not lost
    clock.t = 15.0
    a.step()
    assert not a.is_leader() and lost == [True]


def test_after_a_recognised_renewal_the_leader_renews_on(kube: OperatorKube, clock: Clock) -> None:
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    a.step()
    kube.lose_answers(_leader_lease_write("patch"), LOST_ANSWERS["504"])
    for t in range(5, 60, 2):
        clock.t = t
        a.step()
        b.step()
    assert a.is_leader() and a.renewing() and holder(kube) == "a" and not b.is_leader()
    assert sorted(problems(kube)) == ["LeaderElected", "RenewalFailed"]


@pytest.mark.parametrize("answer", LOST)
def test_a_renewal_that_was_not_applied_is_not_taken_for_ours(
    kube: OperatorKube, clock: Clock, answer: LostAnswer
) -> None:
    """The same error without the write landing: the Lease still shows the renewal before, so the
    leader keeps counting from that one and stops at its deadline."""
    a = elector(kube, clock, "a")
    a.step()

    def refuse(_: object, verb: str, resource: Resource, name: str) -> None:
        if verb == "patch" and resource is LEASES:
            raise answer(Call("PATCH", "", None, {}, verb=verb, plural=LEASES.plural, name=name))

    kube.before.append(refuse)
    for t in (5, 7, 9.9):
        clock.t = t
        a.step()
        assert a.is_leader() and not a.renewing()
    clock.t = 10
    a.step()
    assert not a.is_leader()


@pytest.mark.parametrize("verb", ["create", "replace"], ids=["acquisition", "takeover"])
@pytest.mark.parametrize("answer", LOST)
def test_an_acquisition_applied_whose_answer_was_lost_is_recognised(
    kube: OperatorKube, clock: Clock, answer: LostAnswer, verb: str
) -> None:
    """The Lease was taken under this process's instance and renewTime: it leads at the next look,
    instead of waiting out its own lease as a holder that may be alive."""
    if verb == "replace":
        elector(kube, clock, "old").step()
        clock.t = 1
    a = elector(kube, clock, "a")
    if verb == "replace":
        a.step()  # first sight of the old leader's Lease
        clock.t = 1 + LEASE
    answered = kube.lose_answers(_leader_lease_write(verb), answer)
    sent = clock.t
    a.step()
    assert len(answered) == 1 and holder(kube) == "a"
    kube.before.append(lambda _k, v, r, _n: _refuse_renewals_of(a, v, r))
    clock.t = sent + 2
    a.step()
    assert a.is_leader(), "its own acquisition, recognised"
    assert "DuplicateIdentity" not in problems(kube)
    assert problems(kube).count("LeaderElected") == (2 if verb == "replace" else 1)
    # With no renewal since, it leads for the renew deadline from the acquisition's request.
    clock.t = sent + 9.9
    assert a.is_leader()
    clock.t = sent + 10
    assert not a.is_leader()
