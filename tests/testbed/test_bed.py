"""testbed/bed.py: the e2e `bed` fixture's object binds the scheduler kit's calls to its namespace
(on the in-memory API server), and its class attributes are the kits' own functions and constants."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, cast

import pytest
from testbed.bed import Bed
from testbed.harness import Cluster
from testbed.kits import scheduler as schedulerkit

from shardops.api.common import JSON
from shardops.k8s.api import CAMPAIGNS, EVENTS, SHARDS
from shardops.k8s.events import EventSeries, event_body, occurrences, series_name
from tests.fakekube import FakeKube


def _bed(kube: FakeKube, namespace: str = "ns-a") -> Bed:
    cluster = Cluster(Path("/nonexistent/kubeconfig"), Path("/nonexistent/bin"), cast(Any, None), None)
    bed = Bed(cluster, namespace)
    bed.__dict__["kube"] = kube  # the cached admin client, as the fake API server
    return bed


def test_campaign_calls_act_in_the_beds_namespace_only() -> None:
    kube = FakeKube()
    bed, other = _bed(kube, "ns-a"), _bed(kube, "ns-b")
    created = bed.apply_campaign("c1", [{"n": 1}, {"n": 2}], shardSize=1)
    assert created["metadata"]["namespace"] == "ns-a"
    assert created["spec"]["items"] == [{"n": 1}, {"n": 2}] and created["spec"]["shardSize"] == 1
    assert kube.obj(CAMPAIGNS, "ns-a", "c1") is not None and kube.obj(CAMPAIGNS, "ns-b", "c1") is None
    assert bed.get_campaign("c1")["spec"]["leaseSeconds"] == Bed.LEASE_SECONDS
    bed.patch_spec("c1", {"suspend": True})
    assert kube.obj(CAMPAIGNS, "ns-a", "c1")["spec"]["suspend"] is True  # type: ignore[index]
    assert bed.campaign_phase("c1") is None  # no status yet
    other.apply_campaign("c1", [{"n": 3}])
    assert bed.get_campaign("c1")["spec"]["items"] == [{"n": 1}, {"n": 2}]


def test_shard_calls_and_wait_phase_read_the_beds_namespace() -> None:
    kube = FakeKube()
    bed = _bed(kube)
    kube.put(SHARDS, "ns-a", {"metadata": {"name": "c1-00000"}, "spec": {}, "status": {"phase": "Running"}})
    kube.put(SHARDS, "ns-b", {"metadata": {"name": "c1-00001"}, "spec": {}})
    assert [s["metadata"]["name"] for s in bed.shards()] == ["c1-00000"]
    assert bed.shard_phase("c1-00000") == "Running"
    assert bed.shard_phase("c1-00001") is None  # in another namespace: not there yet, for this bed
    bed.create_campaign(bed.campaign_body("c1", [{"n": 1}]))
    kube.put(CAMPAIGNS, "ns-a", {**bed.get_campaign("c1"), "status": {"phase": "Succeeded"}})
    assert bed.wait_phase("c1", {"Succeeded"}, timeout=1)["status"]["phase"] == "Succeeded"
    with pytest.raises(AssertionError):
        bed.wait_phase("c1", {"Paused"}, timeout=0.3)


def _failed(regarding: JSON, name: str | None = None) -> JSON:
    return event_body(
        regarding,
        reason="Failed",
        note="shard c1-00000 first",
        action="Failed",
        controller="shardops.dev/operator",
        instance="op-0",
        now=dt.datetime(2026, 3, 1, tzinfo=dt.UTC),
        warning=True,
        name=name,
    )


def test_campaign_events_are_those_regarding_the_campaign_and_wait_for_the_series_count() -> None:
    kube = FakeKube()
    bed = _bed(kube)
    campaign = bed.create_campaign(bed.campaign_body("c1", [{"n": 1}]))
    other = bed.create_campaign(bed.campaign_body("c2", [{"n": 1}]))
    at = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    series = EventSeries()
    series.add(kube, _failed(campaign, series_name("c1", "Failed")), 1, at)
    series.add(kube, _failed(other, series_name("c2", "Failed")), 5, at)
    # An Event of the old kind, regarding a shard named like the campaign: not the campaign's.
    shard = {"kind": "Shard", "metadata": {"name": "c1", "namespace": "ns-a"}}
    kube.create(EVENTS, "ns-a", _failed(shard))
    [found] = bed.campaign_events("c1", "Failed")
    assert found["metadata"]["name"] == "c1.failed" and occurrences(found) == 1
    assert bed.campaign_events("c1", "Blocked") == []
    with pytest.raises(AssertionError, match="c1's Failed Event to count 2"):
        bed.wait_campaign_events("c1", "Failed", 2, timeout=0.3)
    series.add(kube, _failed(campaign, series_name("c1", "Failed")), 1, at)
    [counted] = bed.wait_campaign_events("c1", "Failed", 2, timeout=1)
    assert occurrences(counted) == 2


def test_class_attributes_are_the_kits_own() -> None:
    assert Bed.campaign_body is schedulerkit.campaign_body
    assert Bed.phase_of is schedulerkit.phase_of
    assert Bed.OPERATOR_NAME == schedulerkit.OPERATOR_NAME
    assert Bed.scheduler is schedulerkit
    assert Bed.phase_of({"status": {"phase": "Done"}}) == "Done"
