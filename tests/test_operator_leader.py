"""Leader election on an in-memory Lease, with the clocks in the test's hand."""

from __future__ import annotations

import datetime as dt

import pytest

from schedulerkit import NAMESPACE, T0, OperatorKube, settings
from shardops.k8s.api import EVENTS, LEASES, ApiError, Resource
from shardops.scheduler.leader import LeaderElector
from shardops.scheduler.metrics import Metrics

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
def kube() -> OperatorKube:
    return OperatorKube()


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
