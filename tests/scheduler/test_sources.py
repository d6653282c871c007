"""The sharing pass on the leader: shares of a Source handed out to the campaigns that report on it,
lowered before raised, written to the Source's status, and held back after a restart."""

from __future__ import annotations

import datetime as dt
from typing import Any

from shardops.api.campaign import BreakerStatus, Campaign, SourceCooldown
from shardops.api.enums import BreakerState, ConditionReason
from shardops.api.names import API_GROUP_VERSION
from shardops.k8s.api import CLUSTER_SOURCES, EVENTS, SECRETS, SOURCES, ApiError
from shardops.k8s.shards import Actor
from shardops.logic.breaker import CLOSED_BREAKER, SourceBreaker, effective
from shardops.logic.shares import SETTLE_MARGIN
from shardops.scheduler.sources import KEY_RECHECK, SourceSharing
from shardops.state.breakers import cooldown_of
from shardops.state.sources import source_claims
from tests.fakekube import FakeKube

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
# The campaigns' heartbeat interval (leaseSeconds 120 / 3) and the margin.
SETTLE = dt.timedelta(seconds=40) + SETTLE_MARGIN


def source_body(name: str = "team-openai", namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Source",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "baseUrl": "http://upstream/v1",
            "model": "m",
            "rateLimit": {"requestsPerMinute": 120},
            **spec,
        },
    }


def cluster_source_body(**spec: Any) -> dict[str, Any]:
    body = source_body(name="vllm", **spec)
    body["kind"] = "ClusterSource"
    del body["metadata"]["namespace"]
    return body


def campaign(
    name: str,
    share: float | None = None,
    lowered_at: dt.datetime | None = None,
    namespace: str = "team-a",
    ref: dict[str, str] | None = None,
    weight: int = 1,
) -> Campaign:
    status: dict[str, Any] = {"counts": {"pending": 2}}
    if share is not None:
        entry: dict[str, Any] = {"source": "llm", "requestsPerMinute": share}
        if lowered_at is not None:
            entry["loweredAt"] = lowered_at.isoformat()
        status["sourceShares"] = [entry]
    return Campaign.parse(
        {
            "apiVersion": API_GROUP_VERSION,
            "kind": "Campaign",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "items": [{"n": 1}],
                "worker": {"image": "shardops:dev", "command": ["agent"]},
                "sources": [{"name": "llm", "sourceRef": ref or {"name": "team-openai"}, "weight": weight}],
            },
            "status": status,
        }
    )


def report(sharing: SourceSharing, *campaigns: Campaign) -> None:
    for c in campaigns:
        sharing.report(c.namespace, c.name, source_claims(c))


def shares(sharing: SourceSharing, c: Campaign, now: dt.datetime = T0) -> dict[str, float | None]:
    entries = sharing.shares_for(c.namespace, c.name, c.current_status.source_shares, now)
    return {e.source: e.requests_per_minute for e in entries}


def served(*campaigns: Campaign) -> set[tuple[str, str]]:
    return {(c.namespace, c.name) for c in campaigns}


def test_campaigns_new_on_a_source_share_it_by_weight_at_once() -> None:
    kube = FakeKube()
    kube.add(SOURCES, source_body())
    sharing = SourceSharing(kube)
    a, b = campaign("a", weight=1), campaign("b", weight=3)
    report(sharing, a, b)
    sharing.run(served(a, b), T0)
    assert (shares(sharing, a), shares(sharing, b)) == ({"llm": 30.0}, {"llm": 90.0})
    status = kube.obj(SOURCES, "team-a", "team-openai")["status"]  # type: ignore[index]
    assert (status["grantedRequestsPerMinute"], status["campaigns"]) == (120.0, 2)
    assert [(s["campaign"], s["weight"], s["requestsPerMinute"]) for s in status["shares"]] == [
        ("team-a/a", 1, 30.0),
        ("team-a/b", 3, 90.0),
    ]


def test_the_sources_status_totals_each_of_the_four_limits_handed_out() -> None:
    """`kubectl get sources -o wide`: every limit beside what is handed out of it."""
    kube = FakeKube()
    limits = {"requestsPerMinute": 120, "inputTokensPerMinute": 80000, "outputTokensPerMinute": 20000}
    kube.add(SOURCES, source_body(rateLimit=limits))
    sharing = SourceSharing(kube)
    a, b = campaign("a", weight=1), campaign("b", weight=3)
    report(sharing, a, b)
    sharing.run(served(a, b), T0)
    status = kube.obj(SOURCES, "team-a", "team-openai")["status"]  # type: ignore[index]
    granted = [
        status.get(f"granted{k}PerMinute") for k in ("Requests", "Tokens", "InputTokens", "OutputTokens")
    ]
    assert granted == [120.0, None, 80000.0, 20000.0]
    assert [s["inputTokensPerMinute"] for s in status["shares"]] == [20000.0, 60000.0]


def test_a_new_campaign_gets_its_share_once_the_lowered_one_is_in_force() -> None:
    kube = FakeKube()
    kube.add(SOURCES, source_body())
    sharing = SourceSharing(kube)
    a, b = campaign("a", share=120.0), campaign("b")
    report(sharing, a, b)
    sharing.run(served(a, b), T0)
    assert (shares(sharing, a), shares(sharing, b)) == ({"llm": 60.0}, {"llm": 0.0})
    # a's pass writes its lowered share (stamped then); b's raise waits for it to be in force.
    written_at = T0 + dt.timedelta(seconds=3)
    a = campaign("a", share=60.0, lowered_at=written_at)
    report(sharing, a)
    sharing.run(served(a, b), written_at + SETTLE - dt.timedelta(seconds=1))
    assert shares(sharing, b) == {"llm": 0.0}
    sharing.run(served(a, b), written_at + SETTLE)
    assert shares(sharing, b) == {"llm": 60.0}


def test_no_raise_after_a_restart_until_every_campaign_reported() -> None:
    """A new process knows only what is written: a campaign that has not reported yet may hold a share
    (the Source lists it), so nothing grows until it has."""
    kube = FakeKube()
    body = source_body()
    body["status"] = {"shares": [{"campaign": "team-a/b", "weight": 1, "requestsPerMinute": 100.0}]}
    kube.add(SOURCES, body)
    sharing = SourceSharing(kube)
    a, b = campaign("a"), campaign("b", share=100.0)
    report(sharing, a)
    sharing.run(served(a, b), T0)
    assert shares(sharing, a) == {"llm": 0.0}, "b's listed 100 and the restart hold a back"
    report(sharing, b)
    later = T0 + dt.timedelta(seconds=1)
    sharing.run(served(a, b), later)
    assert shares(sharing, b) == {"llm": 60.0}, "lowered at once"
    assert shares(sharing, a) == {"llm": 0.0}, "the lowering the first pass recorded on the Source holds"
    sharing.run(served(a, b), later + SETTLE)
    # b's pass has not written its 60 yet (its status says 100): a gets only the room left beside it.
    assert shares(sharing, a) == {"llm": 20.0}


def test_a_cluster_source_shares_only_with_the_namespaces_it_lists() -> None:
    kube = FakeKube()
    kube.add(CLUSTER_SOURCES, cluster_source_body(namespaces=["team-a"]))
    sharing = SourceSharing(kube)
    ref = {"kind": "ClusterSource", "name": "vllm"}
    ours, theirs = campaign("a", ref=ref), campaign("b", namespace="team-b", ref=ref)
    report(sharing, ours, theirs)
    sharing.run(served(ours, theirs), T0)
    assert shares(sharing, ours) == {"llm": 120.0}
    assert shares(sharing, theirs) == {}, "not listed: no share, its workers do not call"
    assert sharing.problems_for(ours.namespace, ours.name, ours.spec) == {}
    problem = sharing.problems_for(theirs.namespace, theirs.name, theirs.spec)["llm"]
    assert problem.reason is ConditionReason.SOURCE_NOT_ALLOWED
    assert "does not serve namespace team-b" in problem.fix and "spec.namespaces" in problem.fix


def test_a_missing_source_gives_no_share() -> None:
    sharing = SourceSharing(FakeKube())
    a = campaign("a")
    report(sharing, a)
    sharing.run(served(a), T0)
    assert shares(sharing, a) == {"llm": 0.0}


def test_the_sources_status_is_written_only_when_it_changes() -> None:
    kube = FakeKube()
    kube.add(SOURCES, source_body())
    sharing = SourceSharing(kube)
    a = campaign("a")
    report(sharing, a)
    sharing.run(served(a), T0)
    report(sharing, campaign("a", share=120.0))
    sharing.run(served(a), T0 + dt.timedelta(seconds=5))
    assert len(kube.writes_to("sources")) == 1


def test_a_wait_one_campaign_was_told_is_every_campaigns_on_the_source() -> None:
    kube = FakeKube()
    kube.add(SOURCES, source_body())
    sharing = SourceSharing(kube)
    until = T0 + dt.timedelta(seconds=30)
    told = campaign("a")
    told.current_status.source_cooldowns = [SourceCooldown(source="llm", until=until, shard="a-1")]
    other = campaign("b")
    report(sharing, told, other)
    sharing.run(served(told, other), T0)
    assert {s: c.until for s, c in sharing.cooldowns_for("team-a", "b", T0).items()} == {"llm": until}
    assert sharing.cooldowns_for("team-a", "b", until) == {}, "over once it has passed"


def test_a_sources_endpoint_and_key_reach_the_campaign_a_cluster_sources_key_does_not() -> None:
    kube = FakeKube()
    kube.add(SOURCES, source_body(apiKeySecret={"name": "team-key"}))
    cluster = source_body(name="vllm", namespace="", namespaces=["*"], apiKeySecret={"name": "operator-key"})
    cluster["kind"] = "ClusterSource"
    del cluster["metadata"]["namespace"]
    kube.add(CLUSTER_SOURCES, cluster)
    sharing = SourceSharing(kube)
    ours, shared = campaign("a"), campaign("b", ref={"kind": "ClusterSource", "name": "vllm"})
    report(sharing, ours, shared)
    sharing.run(served(ours, shared), T0)
    (entry,) = sharing.shares_for("team-a", "a", [], T0)
    assert (entry.base_url, entry.model) == ("http://upstream/v1", "m")
    assert entry.api_key_secret is not None and entry.api_key_secret.name == "team-key"
    (entry,) = sharing.shares_for("team-a", "b", [], T0)
    assert entry.base_url == "http://upstream/v1"
    assert entry.api_key_secret is None, "a Secret of the operator's namespace is no pod's to read"


def test_three_429s_across_campaigns_open_the_sources_breaker_for_all_with_one_prober() -> None:
    kube = FakeKube()
    kube.add(SOURCES, source_body(cooldownSeconds=120))
    sharing = SourceSharing(kube, Actor("shardops.dev/operator", "op-0"))
    names = ("a", "b", "c")
    campaigns = []
    for name in names:
        c = campaign(name)
        c.current_status.breakers = [BreakerStatus(source="llm", consecutive_failures=1)]
        campaigns.append(c)
    report(sharing, *campaigns)
    sharing.run(served(*campaigns), T0)
    breaker = kube.obj(SOURCES, "team-a", "team-openai")["status"]["breaker"]  # type: ignore[index]
    assert breaker["state"] == "Open"
    # `kubectl describe source` says so once, on the Source itself.
    (event,) = kube.list(EVENTS, "team-a")
    assert (event["reason"], event["type"], event["regarding"]["name"]) == (
        "BreakerOpened",
        "Warning",
        "team-openai",
    )
    assert "3 rate-limited answers in a row" in event["note"] and "fallback" in event["note"]
    sharing.run(served(*campaigns), T0 + dt.timedelta(seconds=5))
    assert len(kube.list(EVENTS, "team-a")) == 1, "announced once, not once a pass"
    after_cooldown = T0 + dt.timedelta(seconds=120)
    states = {}
    for c in campaigns:
        folded: dict[str, SourceBreaker] = {"llm": CLOSED_BREAKER}
        sharing.adopt_breakers(c.namespace, c.name, folded, c.spec)
        states[c.name] = effective(folded["llm"], after_cooldown, cooldown_of(c.spec, "llm"))
    assert states == {"a": BreakerState.HALF_OPEN, "b": BreakerState.OPEN, "c": BreakerState.OPEN}


def test_a_missing_source_is_named_with_its_field_and_fix_until_it_appears() -> None:
    kube = FakeKube()
    sharing = SourceSharing(kube)
    a = campaign("a")
    report(sharing, a)
    sharing.run(served(a), T0)
    problem = sharing.problems_for(a.namespace, a.name, a.spec)["llm"]
    assert (problem.index, problem.reason) == (0, ConditionReason.SOURCE_NOT_FOUND)
    assert "no Source team-openai in namespace team-a" in problem.fix
    kube.fail = lambda call: ApiError(503, "Unavailable", "down") if call.method == "GET" else None
    sharing.run(served(a), T0 + dt.timedelta(seconds=5))
    assert set(sharing.problems_for(a.namespace, a.name, a.spec)) == {"llm"}, "not read: it stands"
    kube.fail = lambda call: None
    kube.add(SOURCES, source_body())
    sharing.run(served(a), T0 + dt.timedelta(seconds=10))
    assert sharing.problems_for(a.namespace, a.name, a.spec) == {}


KEY_SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "openai", "namespace": "team-a"},
    "data": {"api-key": "eA=="},
}


def _ready(
    kube: FakeKube, resource: Any = SOURCES, namespace: str = "team-a", name: str = "team-openai"
) -> Any:
    conditions = kube.obj(resource, namespace, name)["status"]["conditions"]  # type: ignore[index]
    return next((c["status"], c["reason"], c["message"]) for c in conditions if c["type"] == "Ready")


def test_a_sources_missing_key_secret_makes_it_not_ready_naming_the_fix_and_is_written_once() -> None:
    kube = FakeKube()
    kube.add(SOURCES, source_body(apiKeySecret={"name": "openai", "key": "api-key"}))
    sharing = SourceSharing(kube)
    a = campaign("a")
    report(sharing, a)
    sharing.run(served(a), T0)
    status, reason, message = _ready(kube)
    assert (status, reason) == ("False", "KeySecretMissing")
    assert "spec.apiKeySecret: no Secret openai in namespace team-a" in message
    assert "kubectl -n team-a create secret generic openai --from-literal=api-key=" in message
    writes = len(kube.writes_to("sources"))
    sharing.run(served(a), T0 + dt.timedelta(seconds=5))
    assert len(kube.writes_to("sources")) == writes, "unchanged: not written again"
    kube.add(SECRETS, KEY_SECRET)
    sharing.run(served(a), T0 + dt.timedelta(seconds=10))
    assert _ready(kube)[:2] == ("True", "SourceUsable")


def test_a_found_key_secret_is_read_again_only_when_the_source_changes_or_a_recheck_is_due() -> None:
    kube = FakeKube()
    kube.add(SOURCES, source_body(apiKeySecret={"name": "openai", "key": "api-key"}))
    kube.add(SECRETS, KEY_SECRET)
    sharing = SourceSharing(kube)
    a = campaign("a")
    report(sharing, a)

    def secret_reads_at(seconds: float) -> int:
        before = sum(1 for c in kube.calls if c.method == "GET" and "/secrets/" in c.path)
        sharing.run(served(a), T0 + dt.timedelta(seconds=seconds))
        return sum(1 for c in kube.calls if c.method == "GET" and "/secrets/" in c.path) - before

    assert secret_reads_at(0) == 1
    assert [secret_reads_at(s) for s in (5, 10, 55)] == [0, 0, 0], "a pass every 5 s reads it no more"
    assert secret_reads_at(KEY_RECHECK.total_seconds()) == 1, "rechecked: a deleted Secret is noticed"
    edited = source_body(apiKeySecret={"name": "openai", "key": "api-key"})
    edited["metadata"]["generation"] = 2
    kube.add(SOURCES, edited)
    assert secret_reads_at(KEY_RECHECK.total_seconds() + 5) == 1, "the Source's spec changed"
    assert _ready(kube)[:2] == ("True", "SourceUsable")


def test_a_cluster_source_listing_no_namespace_is_not_ready() -> None:
    kube = FakeKube()
    kube.add(CLUSTER_SOURCES, cluster_source_body())
    sharing = SourceSharing(kube)
    a = campaign("a", ref={"kind": "ClusterSource", "name": "vllm"})
    report(sharing, a)
    sharing.run(served(a), T0)
    assert _ready(kube, CLUSTER_SOURCES, "", "vllm")[:2] == ("False", "NoNamespaces")
    assert (
        sharing.problems_for(a.namespace, a.name, a.spec)["llm"].reason is ConditionReason.SOURCE_NOT_ALLOWED
    )
