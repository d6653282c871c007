"""A Campaign as a claimant of shared Sources, and the shares its status records."""

from __future__ import annotations

import datetime as dt
from typing import Any

from shardops.api.campaign import Campaign, SourceShare
from shardops.api.enums import CampaignPhase, SourceKind
from shardops.api.llm import SecretKeyRef
from shardops.api.names import API_GROUP_VERSION
from shardops.logic.shares import Rates
from shardops.state.sources import Endpoint, SourceKey, share_entries, source_claims, waiting_for_sources

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def campaign(status: dict[str, Any] | None = None, **spec: Any) -> Campaign:
    body: dict[str, Any] = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Campaign",
        "metadata": {"name": "eval", "namespace": "team-a"},
        "spec": {
            "items": [{"n": 1}],
            "worker": {"image": "shardops:dev", "command": ["agent"]},
            "maxConcurrency": 4,
            "priority": 2,
            "sources": [
                {"name": "own", "rateLimit": {"requestsPerMinute": 10}},
                {"name": "team", "sourceRef": {"name": "team-openai"}, "weight": 3},
                {"name": "shared", "sourceRef": {"kind": "ClusterSource", "name": "vllm"}},
            ],
            **spec,
        },
    }
    if status is not None:
        body["status"] = status
    return Campaign.parse(body)


def test_each_source_ref_is_a_claim_keyed_by_its_source() -> None:
    claims = source_claims(campaign({"counts": {"pending": 1}}))
    assert [(c.source, c.key) for c in claims] == [
        ("team", SourceKey(SourceKind.SOURCE, "team-a", "team-openai")),
        ("shared", SourceKey(SourceKind.CLUSTER_SOURCE, "", "vllm")),
    ], "a Source is the campaign's namespace's; a ClusterSource has none; an own rateLimit is no claim"
    team = claims[0].claimant
    assert (team.campaign, team.weight, team.priority, team.workers, team.active) == (
        "team-a/eval",
        3,
        2,
        4,
        True,
    )
    assert claims[0].heartbeat_seconds == 40
    assert claims[0].granted is None


def test_a_campaign_without_work_or_finished_is_idle() -> None:
    assert not source_claims(campaign({"counts": {"done": 3}}))[0].claimant.active
    finished = {"phase": str(CampaignPhase.SUCCEEDED), "counts": {"pending": 1}}
    assert not source_claims(campaign(finished))[0].claimant.active
    suspended = {"counts": {"queued": 5, "paused": 2}}
    assert not source_claims(campaign(suspended, suspend=True))[0].claimant.active
    finishing = {"counts": {"queued": 5, "running": 1}}
    assert source_claims(campaign(finishing, suspend=True))[0].claimant.active


def test_the_written_share_is_what_the_claim_holds() -> None:
    status = {"counts": {"running": 1}, "sourceShares": [{"source": "team", "requestsPerMinute": 30}]}
    granted = source_claims(campaign(status))[0].granted
    assert granted is not None and granted.rates == Rates(30.0, None)


def test_a_lowered_share_is_stamped_with_the_write_others_keep_theirs() -> None:
    earlier = T0 - dt.timedelta(minutes=5)
    previous = [
        SourceShare(source="a", requests_per_minute=60, lowered_at=earlier),
        SourceShare(source="b", requests_per_minute=60, lowered_at=earlier),
        SourceShare(source="c", requests_per_minute=60),
    ]
    entries = share_entries(previous, {"a": Rates(40.0), "b": Rates(90.0), "d": Rates(10.0)}, T0)
    by_source = {e.source: (e.requests_per_minute, e.lowered_at) for e in entries}
    assert by_source == {
        "a": (40.0, T0),
        "b": (90.0, earlier),
        "c": (60.0, None),
        "d": (10.0, None),
    }


def test_a_limit_where_there_was_none_is_a_lowering() -> None:
    previous = [SourceShare(source="a", tokens_per_minute=None)]
    (entry,) = share_entries(previous, {"a": Rates(None, 500.0)}, T0)
    assert entry.lowered_at == T0


def test_workers_wait_until_every_shared_source_is_resolved() -> None:
    llm = {
        "baseUrl": "http://own/v1",
        "model": "m",
        "messages": [{"role": "user", "content": "{{ item.n }}"}],
    }
    worker = {"image": "shardops:dev", "command": ["shardops", "llm"], "llm": llm}
    unresolved = campaign({"sourceShares": [{"source": "team", "requestsPerMinute": 0}]}, worker=worker)
    assert waiting_for_sources(unresolved) == ["team", "shared"]
    entries = [
        {"source": "team", "requestsPerMinute": 60, "baseUrl": "http://up/v1", "model": "m"},
        {"source": "shared", "requestsPerMinute": 60, "baseUrl": "http://vllm/v1", "model": "m"},
    ]
    assert waiting_for_sources(campaign({"sourceShares": entries}, worker=worker)) == []
    assert waiting_for_sources(campaign()) == [], "a command of the user's own is not held"


def test_a_decision_carries_the_sources_endpoint_into_the_entry() -> None:
    endpoint = Endpoint("http://up/v1", "m", SecretKeyRef(name="key"), None)
    (entry,) = share_entries([], {"team": Rates(60.0)}, T0, {"team": endpoint})
    assert (entry.base_url, entry.model, entry.api_key_secret) == (
        "http://up/v1",
        "m",
        SecretKeyRef(name="key"),
    )
