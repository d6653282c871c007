"""Builders for the operator's unit tests (no tests here): the in-memory API server with a few
operator-specific questions, and a Reconciler wired to it with an injected clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from shardops.api.common import JSON
from shardops.api.names import CAMPAIGN_LABEL, CLASS_LABEL
from shardops.k8s.api import CAMPAIGNS, EVENTS, LEASES, SECRETS, SHARDS, ApiError, Resource
from shardops.logic.idempotency import idempotency_key
from shardops.logic.timefmt import micro_time
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.reconcile import Reconciler
from shardops.scheduler.settings import OperatorSettings
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
__all__ = ["NAMESPACE", "OperatorKube"]


class OperatorKube(FakeKube):
    """FakeKube plus the reasons of the Events written and a count of Campaign status writes."""

    def event_reasons(self, regarding: str | None = None) -> list[str]:
        return [
            e["reason"]
            for e in self.list(EVENTS, NAMESPACE)
            if regarding is None or e["regarding"]["name"] == regarding
        ]

    def status_writes(self, name: str) -> int:
        return len(self.writes_to("campaigns", name))


class Clock:
    def __init__(self, start: dt.datetime = T0) -> None:
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> Clock:
        self.now += dt.timedelta(seconds=seconds)
        return self


def settings(**overrides: Any) -> OperatorSettings:
    return OperatorSettings(**{"identity": "op-test", "metrics_port": 0, **overrides})


def reconciler(kube: OperatorKube, clock: Clock, provisioned: bool = True, **overrides: Any) -> Reconciler:
    """A Reconciler with the test's settings; `provisioned`: the namespace has its store Secret, as
    an admin creates it when adding a namespace (docs/install.md)."""
    operator_settings = settings(**overrides)
    secret = operator_settings.store_secret
    if provisioned and secret and operator_settings.result_store == "S3":
        kube.put(SECRETS, NAMESPACE, {"metadata": {"name": secret}, "data": {}})
    # Renewals are timed on the operator's monotonic clock: the test clock stands in for both.
    return Reconciler(
        kube,  # type: ignore[arg-type]
        operator_settings,
        Metrics(),
        clock=clock,
        monotonic=lambda: clock.now.timestamp(),  # noqa: PLW0108 - clock.now is replaced as time passes
    )


def campaign(name: str = "camp", items: list[JSON] | None = None, **spec: Any) -> JSON:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": name, "generation": 1, "uid": f"uid-{name}"},
        "spec": {
            "items": items if items is not None else [{"id": i} for i in range(4)],
            "shardSize": 1,
            "leaseSeconds": 30,
            "heartbeatSeconds": 10,
            "worker": {"image": "img", "command": ["agent"]},
            **spec,
        },
    }


def put_campaign(kube: OperatorKube, body: JSON) -> JSON:
    return kube.put(CAMPAIGNS, NAMESPACE, body)


def shard(
    campaign_name: str,
    index: int,
    phase: str | None,
    *,
    items: list[JSON] | None = None,
    attempt: int = 1,
    history: list[JSON] | None = None,
    shard_class: str = "work",
    **status: Any,
) -> JSON:
    chunk = items if items is not None else [{"id": index}]
    body: JSON = {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Shard",
        "metadata": {
            "name": f"{campaign_name}-{index:05d}" if shard_class == "work" else f"{campaign_name}-finalize",
            "labels": {CAMPAIGN_LABEL: campaign_name, CLASS_LABEL: shard_class},
        },
        "spec": {
            "campaign": campaign_name,
            "index": index,
            "shardClass": shard_class,
            "idempotencyKey": idempotency_key(campaign_name, chunk, ["agent"]),
            **({"items": chunk} if shard_class == "work" else {}),
        },
    }
    if phase is not None:
        body["status"] = {
            "phase": phase,
            "attempt": attempt,
            "history": history if history is not None else [entry(phase, T0, "Materialized", attempt)],
            **status,
        }
    return body


def entry(phase: str, at: dt.datetime, reason: str, attempt: int = 1, **extra: Any) -> JSON:
    return {"phase": phase, "at": at.isoformat(), "reason": reason, "attempt": attempt, **extra}


def put_shard(kube: OperatorKube, body: JSON) -> JSON:
    return kube.put(SHARDS, NAMESPACE, body)


def put_lease(
    kube: OperatorKube, name: str, holder: str | None, renewed: dt.datetime, seconds: int = 30
) -> JSON:
    spec: JSON = {"leaseDurationSeconds": seconds, "leaseTransitions": 1}
    if holder is not None:
        spec.update(holderIdentity=holder, renewTime=micro_time(renewed), acquireTime=micro_time(renewed))
    return kube.put(LEASES, NAMESPACE, {"metadata": {"name": name}, "spec": spec})


def status_of(kube: OperatorKube, name: str = "camp") -> JSON:
    found = kube.obj(CAMPAIGNS, NAMESPACE, name)
    assert found is not None
    return dict(found.get("status") or {})


def shard_of(kube: OperatorKube, name: str) -> JSON:
    found = kube.obj(SHARDS, NAMESPACE, name)
    assert found is not None
    return found


def condition(status: JSON, type_: str) -> JSON:
    return next(c for c in status.get("conditions") or [] if c["type"] == type_)


def is_status_write(verb: str, resource: Resource) -> bool:
    """A write of a Campaign's status, as the operator's reconcile makes it."""
    return verb == "patch" and resource is CAMPAIGNS


def conflict_status_writes(
    kube: OperatorKube, times: int, then: list[Callable[[], None]] | None = None
) -> list[int]:
    """The next `times` campaign-status writes lose: just before each, another writer changes the
    Campaign (a label), so its resourceVersion precondition fails as the API server's would.
    `then`: steps run once, right after the first write is made to lose (what else happened meanwhile)."""
    lost: list[int] = []

    def change_first(fake: OperatorKube, verb: str, resource: Resource, name: str) -> None:
        if not is_status_write(verb, resource) or len(lost) >= times:
            return
        stored = fake.obj(CAMPAIGNS, NAMESPACE, name)
        assert stored is not None
        stored["metadata"].setdefault("labels", {})["touched"] = str(len(lost))
        fake.put(CAMPAIGNS, NAMESPACE, stored)
        lost.append(1)
        if then and len(lost) == 1:
            for step in then:
                step()

    kube.before.append(change_first)
    return lost


def fail_status_writes(kube: OperatorKube, why: str) -> None:
    """From now on every campaign-status write fails with 503 `why` and is not applied (until the
    caller clears `kube.before`)."""

    def unavailable(fake: OperatorKube, verb: str, resource: Resource, name: str) -> None:
        if is_status_write(verb, resource):
            raise ApiError(503, "ServiceUnavailable", why)

    kube.before.append(unavailable)


def run(kube: OperatorKube, clock: Clock, name: str = "camp") -> None:
    reconciler(kube, clock).reconcile(NAMESPACE, name)


def watching(kube: OperatorKube, clock: Clock, name: str = "camp") -> Reconciler:
    """An operator that has made one pass: it has seen the claims as they are now. Expiry is judged on
    its own clock from when it saw a claim renewed, so a fresh one never reclaims at once."""
    operator = reconciler(kube, clock)
    operator.reconcile(NAMESPACE, name)
    return operator


def beat(kube: OperatorKube, clock: Clock, shard_name: str = "camp-00000", seconds: int = 30) -> None:
    """A heartbeat as a worker writes it: the Lease renewed, then lastHeartbeat and leaseUntil."""
    put_lease(kube, shard_name, "w1", clock.now, seconds=seconds)
    until = clock.now + dt.timedelta(seconds=seconds)
    status = {"lastHeartbeat": clock.now.isoformat(), "leaseUntil": until.isoformat()}
    kube.patch(SHARDS, NAMESPACE, shard_name, {"status": status}, subresource="status")


def names(kube: OperatorKube, resource: object = SHARDS) -> list[str]:
    return sorted(o["metadata"]["name"] for o in kube.list(resource, NAMESPACE))  # type: ignore[arg-type]
