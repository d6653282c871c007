"""A campaign's Event series (k8s/events.py): one Event per campaign and reason however often it
happens, its series count raised by one write at a time."""

from __future__ import annotations

import datetime as dt

from shardops.api.common import JSON
from shardops.k8s.api import EVENTS, ApiError
from shardops.k8s.events import EventSeries, event_body, series_name
from tests.fakekube import Call, FakeKube

NAMESPACE = "team"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
CAMPAIGN: JSON = {
    "apiVersion": "shardops.dev/v1alpha1",
    "kind": "Campaign",
    "metadata": {"name": "camp", "namespace": NAMESPACE, "uid": "uid-camp"},
}


def failed(note: str = "shard camp-00007 first") -> JSON:
    return event_body(
        CAMPAIGN,
        reason="Failed",
        note=note,
        action="Failed",
        controller="shardops.dev/operator",
        instance="op-0",
        now=T0,
        warning=True,
        name=series_name("camp", "Failed"),
    )


def event_writes(kube: FakeKube) -> list[tuple[str, str, str, int]]:
    return [entry for entry in kube.write_log() if entry[1] == "events"]


def test_many_occurrences_make_one_event_whose_series_counts_them_one_write_each() -> None:
    kube = FakeKube()
    series = EventSeries()
    for minute in range(40):
        assert series.add(kube, failed(), 3, T0 + dt.timedelta(minutes=minute)) == "camp.failed"
    [event] = kube.events()
    assert event["series"] == {"count": 120, "lastObservedTime": "2026-03-01T12:39:00.000000Z"}
    assert event["regarding"]["kind"] == "Campaign" and event["type"] == "Warning"
    # The first add creates it, every other one is a single PUT from memory: no reads.
    assert [verb for verb, *_ in event_writes(kube)] == ["create"] + ["replace"] * 39
    assert not [call for call in kube.calls if call.method == "GET" and "/events" in call.path]


def test_one_occurrence_is_a_plain_event_without_a_series() -> None:
    """The API server wants a series to count at least two."""
    kube = FakeKube()
    EventSeries().add(kube, failed(), 1, T0)
    [event] = kube.events()
    assert "series" not in event


def test_a_new_leader_adds_to_the_event_its_predecessor_wrote() -> None:
    kube = FakeKube()
    EventSeries().add(kube, failed(), 5, T0)
    assert EventSeries().add(kube, failed(), 2, T0 + dt.timedelta(minutes=1)) == "camp.failed"
    [event] = kube.events()
    assert event["series"]["count"] == 7


def test_a_lost_race_reads_the_event_again_and_counts_on_top() -> None:
    kube = FakeKube()
    series = EventSeries()
    series.add(kube, failed(), 2, T0)
    stored = kube.obj(EVENTS, NAMESPACE, "camp.failed")
    assert stored is not None
    kube.put(EVENTS, NAMESPACE, {**stored, "series": {**stored["series"], "count": 10}})  # another writer
    assert series.add(kube, failed(), 1, T0 + dt.timedelta(minutes=1)) == "camp.failed"
    assert kube.obj(EVENTS, NAMESPACE, "camp.failed")["series"]["count"] == 11  # type: ignore[index]


def test_an_expired_event_is_created_again() -> None:
    """The API server keeps an Event an hour after its last write; the memory may outlive it."""
    kube = FakeKube()
    series = EventSeries()
    series.add(kube, failed(), 4, T0)
    del kube.objects[("events", NAMESPACE, "camp.failed")]
    series.add(kube, failed(), 2, T0 + dt.timedelta(hours=2))
    assert kube.obj(EVENTS, NAMESPACE, "camp.failed")["series"]["count"] == 2  # type: ignore[index]


def test_an_event_that_cannot_be_written_stops_nothing() -> None:
    def refuse(call: Call) -> BaseException | None:
        return ApiError(403, "Forbidden", "no") if "/events" in call.path else None

    kube = FakeKube(fail=refuse)
    series = EventSeries()
    assert series.add(kube, failed(), 3, T0) is None
    kube.fail = lambda call: None
    series.add(kube, failed(), 1, T0)
    assert kube.events()[0].get("series") is None, "what could not be written is not counted twice"


def test_forget_drops_only_that_campaigns_series() -> None:
    kube = FakeKube()
    series = EventSeries()
    series.add(kube, failed(), 2, T0)
    other = {**CAMPAIGN, "metadata": {**CAMPAIGN["metadata"], "name": "camp.b", "uid": "uid-b"}}
    body = {**failed(), "regarding": {**failed()["regarding"], "name": "camp.b"}}
    body["metadata"] = {**body["metadata"], "name": series_name(str(other["metadata"]["name"]), "Failed")}
    series.add(kube, body, 2, T0)
    series.forget(NAMESPACE, "camp")
    before = len(kube.calls)
    series.add(kube, body, 1, T0)
    assert [call.method for call in kube.calls[before:]] == ["PUT"], "camp.b's series still in memory"


def test_the_series_name_fits_an_object_name_and_keeps_the_reason() -> None:
    name = series_name("c" * 253, "GaveUpShardsFolded")
    assert len(name) == 253 and name.endswith(".gaveupshardsfolded")


def test_a_cluster_scoped_objects_event_is_kept_in_default_and_refers_to_no_namespace() -> None:
    source = {"apiVersion": "shardops.dev/v1alpha1", "kind": "ClusterSource", "metadata": {"name": "vllm"}}
    body = event_body(
        source, reason="BreakerOpened", note="n", action="Breaker", controller="c", instance="i", now=T0
    )
    assert body["metadata"]["namespace"] == "default"
    assert body["regarding"]["namespace"] is None and body["regarding"]["kind"] == "ClusterSource"
