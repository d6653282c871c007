"""testbed/bed.py: the e2e `bed` fixture's object binds the scheduler kit's calls to its namespace
(on the in-memory API server), and its class attributes are the kits' own functions and constants."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from testbed.bed import Bed
from testbed.harness import Cluster
from testbed.kits import scheduler as schedulerkit

from shardops.k8s.api import CAMPAIGNS, SHARDS
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


def test_class_attributes_are_the_kits_own() -> None:
    assert Bed.campaign_body is schedulerkit.campaign_body
    assert Bed.phase_of is schedulerkit.phase_of
    assert Bed.OPERATOR_NAME == schedulerkit.OPERATOR_NAME
    assert Bed.scheduler is schedulerkit
    assert Bed.phase_of({"status": {"phase": "Done"}}) == "Done"
