"""The operator runs no Campaign of its own namespace: workers there could take its leader Lease."""

from __future__ import annotations

from shardops.k8s.api import JOBS, SHARDS
from tests.schedulerkit import (
    NAMESPACE,
    Clock,
    OperatorKube,
    campaign,
    condition,
    put_campaign,
    reconciler,
    status_of,
)


def test_a_campaign_in_the_operator_namespace_is_refused_with_the_fix() -> None:
    kube, clock = OperatorKube(), Clock()
    put_campaign(kube, campaign())
    reconciler(kube, clock, leader_election_namespace=NAMESPACE).reconcile(NAMESPACE, "camp")
    status = status_of(kube)
    ready = condition(status, "Ready")
    assert status["phase"] == "Invalid"
    assert ready["status"] == "False" and ready["reason"] == "InOperatorNamespace"
    assert f"Campaign camp is in namespace {NAMESPACE}, where the shardops operator runs" in ready["message"]
    assert "watch.namespaces and workers.namespaces" in ready["message"]
    assert kube.list(SHARDS, NAMESPACE) == [] and kube.list(JOBS, NAMESPACE) == []
    assert kube.event_reasons("camp") == ["InOperatorNamespace"]


def test_campaigns_elsewhere_run() -> None:
    kube, clock = OperatorKube(), Clock()
    put_campaign(kube, campaign())
    reconciler(kube, clock, leader_election_namespace="shardops-system").reconcile(NAMESPACE, "camp")
    assert condition(status_of(kube), "Ready")["reason"] != "InOperatorNamespace"
    assert kube.list(SHARDS, NAMESPACE)


def test_a_sandbox_may_allow_its_own_namespace() -> None:
    kube, clock = OperatorKube(), Clock()
    put_campaign(kube, campaign())
    sandbox = reconciler(
        kube, clock, leader_election_namespace=NAMESPACE, allow_campaigns_in_operator_namespace=True
    )
    sandbox.reconcile(NAMESPACE, "camp")
    assert condition(status_of(kube), "Ready")["reason"] != "InOperatorNamespace"
    assert kube.list(SHARDS, NAMESPACE)
