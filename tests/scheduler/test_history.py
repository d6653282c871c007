"""The shard history folded into the breakers (scheduler/history.py): the fold is computed without
writing anything; only `commit`, once the status holds it, counts it and announces what turned."""

from __future__ import annotations

from shardops.api.campaign import Campaign
from shardops.api.enums import BreakerState
from shardops.api.shard import Shard
from shardops.k8s.api import EVENTS
from shardops.k8s.events import EventSeries
from shardops.k8s.shards import Actor
from shardops.scheduler.history import commit, fold_history
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.observed import Observed
from tests.schedulerkit import NAMESPACE, T0, OperatorKube, campaign, entry, put_campaign, shard

SOURCES = [{"name": "A", "fallback": "B", "cooldownSeconds": 60}, {"name": "B"}]


def _rate_limited(index: int) -> Shard:
    at = T0.replace(second=10 + index)
    history = [
        entry("Pending", T0, "Materialized"),
        entry("Running", at, "Claimed", source="A"),
        entry("Pending", at, "AttemptFailed", source="A", errorClass="rate-limited"),
    ]
    return Shard.parse(shard("camp", index, "Pending", attempt=2, history=history))


def _seen(kube: OperatorKube) -> Observed:
    body = put_campaign(kube, campaign(items=[{"id": i} for i in range(3)], sources=SOURCES))
    parsed = Campaign.parse(body)
    shards = {s.name: s for s in (_rate_limited(i) for i in range(3))}
    return Observed(body, parsed, list(parsed.spec.items or []), shards, [], [])


def test_the_fold_opens_the_breaker_and_marks_each_shards_entries_without_a_write() -> None:
    kube = OperatorKube()
    seen = _seen(kube)
    before = len(kube.calls)
    fold = fold_history(seen, seen.campaign.current_status)
    assert len(kube.calls) == before, "computing the fold writes nothing"
    assert fold.states["A"].state is BreakerState.OPEN and fold.opened == ["A"]
    assert fold.marks == {f"camp-{i:05d}": 3 for i in range(3)}, "every entry of each shard folded"
    assert len(fold.outcomes) == 9, "three entries of each of the three shards"


def test_commit_counts_the_fold_and_announces_the_breaker_once_the_status_holds_it() -> None:
    kube = OperatorKube()
    seen = _seen(kube)
    metrics = Metrics()
    fold = fold_history(seen, seen.campaign.current_status)
    commit(
        kube,
        metrics,
        Actor(controller="c", instance="op-test"),
        EventSeries(),
        seen,
        fold,
        T0.replace(second=30),
    )
    # The three failed attempts in the campaign's one AttemptFailed Event, the breaker in its own.
    assert sorted(kube.event_reasons("camp")) == ["AttemptFailed", "BreakerOpened"]
    assert kube.obj(EVENTS, NAMESPACE, "camp.attemptfailed")["series"]["count"] == 3
    states = {
        state: metrics.registry.get_sample_value(
            "shardops_breaker_state", {"campaign": f"{NAMESPACE}/camp", "source": "A", "state": state}
        )
        for state in ("Closed", "HalfOpen", "Open")
    }
    assert states == {"Closed": 0, "HalfOpen": 0, "Open": 1}


def test_shards_that_fail_are_counted_in_one_event_per_reason_one_write_each() -> None:
    """Issue 31: an Event per failed shard kept one per shard alive for the API server's hour;
    now the pass that folds their history raises the campaign's Event for the reason by their
    number, one write per reason however many failed."""
    kube = OperatorKube()
    body = put_campaign(kube, campaign(items=[{"id": i} for i in range(40)]))
    parsed = Campaign.parse(body)
    at = T0.replace(second=10)
    shards = {
        s.name: s
        for s in (
            Shard.parse(
                shard(
                    "camp",
                    i,
                    "Failed",
                    history=[
                        entry("Running", at, "Claimed"),
                        entry("Failed", at, "Failed", errorClass="invalid-input"),
                    ],
                )
            )
            for i in range(40)
        )
    }
    seen = Observed(body, parsed, list(parsed.spec.items or []), shards, [], [])
    series = EventSeries()
    actor = Actor(controller="c", instance="op-test")
    commit(kube, Metrics(), actor, series, seen, fold_history(seen, parsed.current_status), at)
    [event] = kube.events()
    assert (event["reason"], event["type"], event["series"]["count"]) == ("Failed", "Warning", 40)
    assert event["regarding"]["name"] == "camp" and "camp-00000 (invalid-input)" in event["note"]
    assert len(kube.writes_to("events")) == 1
