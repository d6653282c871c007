"""Settings from the environment, kopf wiring on an explicit registry, metrics on their own registry."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
import pytest
from prometheus_client import REGISTRY

from shardops.api.enums import ShardPhase
from shardops.api.names import KOPF_FINALIZER
from shardops.k8s.api import CAMPAIGNS
from shardops.scheduler import handlers
from shardops.scheduler.main import LoopHeartbeat, kopf_settings
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.reconcile import Reconciler
from shardops.scheduler.settings import OperatorSettings
from shardops.scheduler.ticker import CampaignTicker
from tests.schedulerkit import OperatorKube, reconciler, settings


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDOPS_TICK_SECONDS", "2.5")
    monkeypatch.setenv("SHARDOPS_NAMESPACES", "a, b,,c")
    monkeypatch.setenv("SHARDOPS_POD_NAME", "operator-7f9-x")
    monkeypatch.setenv("SHARDOPS_LEADER_ELECTION_NAMESPACE", "shardops-system")
    monkeypatch.setenv("SHARDOPS_LEADER_ELECTION_LEASE_SECONDS", "30")
    monkeypatch.setenv("SHARDOPS_METRICS_PORT", "9090")
    loaded = OperatorSettings()
    assert loaded.tick_seconds == 2.5 and loaded.namespaces == ["a", "b", "c"]
    assert loaded.identity == "operator-7f9-x" and loaded.leader_election_namespace == "shardops-system"
    assert loaded.metrics_port == 9090 and loaded.renew_deadline_seconds == 20


@pytest.mark.parametrize(
    ("given", "expected"), [("[]", []), ('["a", "b"]', ["a", "b"]), ("a", ["a"]), ("", [])]
)
def test_namespaces_as_the_chart_renders_them(
    monkeypatch: pytest.MonkeyPatch, given: str, expected: list[str]
) -> None:
    monkeypatch.setenv("SHARDOPS_NAMESPACES", given)
    assert OperatorSettings().namespaces == expected


def test_settings_defaults_and_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SHARDOPS_POD_NAME", "SHARDOPS_IDENTITY", "SHARDOPS_NAMESPACES", "SHARDOPS_TICK_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POD_NAME", "from-downward-api")
    loaded = OperatorSettings()
    assert (loaded.tick_seconds, loaded.metrics_port, loaded.namespaces) == (5.0, 8080, [])
    assert loaded.identity == "from-downward-api" and loaded.leader_election_lease_seconds == 15


def test_renewals_must_fit_several_times_in_a_lease() -> None:
    with pytest.raises(ValueError, match="less than half"):
        OperatorSettings(leader_election_lease_seconds=10, leader_election_renew_seconds=5)


def _registered(tick_seconds: float = 7) -> tuple[kopf.OperatorRegistry, CampaignTicker, Reconciler]:
    registry = kopf.OperatorRegistry()
    operator = reconciler(OperatorKube(), lambda: None)  # type: ignore[arg-type]
    ticker = CampaignTicker(operator.kick, tick_seconds, ThreadPoolExecutor(max_workers=1))
    handlers.register(registry, settings(tick_seconds=tick_seconds), operator, ticker)
    return registry, ticker, operator


def _every_handler(registry: kopf.OperatorRegistry) -> list[Any]:
    return [
        *registry._changing.get_all_handlers(),
        *registry._spawning.get_all_handlers(),
        *registry._watching.get_all_handlers(),
        *registry._indexing.get_all_handlers(),
        *registry._webhooks.get_all_handlers(),
    ]


def test_handlers_are_registered_with_ids() -> None:
    registry, _, _ = _registered()
    watching = registry._watching.get_all_handlers()
    # No change handler: kopf would keep a copy of each Campaign's spec in an annotation.
    assert not registry._changing.get_all_handlers()
    assert sorted(h.id for h in watching) == [
        "campaign-index",
        "campaign-reconcile",
        "old-finalizer",
        "shard-changed",
    ]
    assert not registry._spawning.get_all_handlers(), "no timers, no daemons: the tick is ticker.py"
    assert [h.id for h in registry._activities.get_all_handlers()] == ["login"]
    assert not kopf.get_default_registry()._changing.get_all_handlers(), "nothing at import time"


def test_a_campaign_is_reconciled_when_first_seen_and_when_its_spec_changes_not_on_status_writes() -> None:
    registry, _, operator = _registered()
    (handler,) = [h for h in registry._watching.get_all_handlers() if h.id == "campaign-reconcile"]
    kicked: list[tuple[str, str]] = []
    operator.kick = lambda namespace, name: kicked.append((namespace, name)) or True  # type: ignore[method-assign]
    resumed = {"shardops.dev/resumed": "2026-01-01T00:00:00Z"}
    events = [
        (None, "u1", 1, {}, True),  # the first listing (or the create)
        ("MODIFIED", "u1", 1, {}, False),  # a status write: no new generation
        ("MODIFIED", "u1", 2, {}, True),  # the spec changed
        ("MODIFIED", "u1", 2, {"other.io/x": "1"}, False),  # not ours
        ("MODIFIED", "u1", 2, resumed, True),  # `kubectl campaign resume` of a held campaign
        ("MODIFIED", "u1", 2, resumed, False),
        ("DELETED", "u1", 2, resumed, False),
        ("ADDED", "u2", 1, {}, True),  # applied again: a new Campaign of the same name
        ("MODIFIED", "u3", 1, {}, True),  # deleted and applied again between two events
    ]
    for type_, uid, generation, ours, expected in events:
        before = len(kicked)
        meta = {
            "name": "c",
            "namespace": "ns",
            "uid": uid,
            "generation": generation,
            "annotations": ours,
        }
        handler.fn(type=type_, namespace="ns", name="c", body=kopf.Body({"metadata": meta}))
        assert (len(kicked) > before) is expected, (type_, uid, generation, ours)
    assert set(kicked) == {("ns", "c")}


def test_no_handler_makes_kopf_add_a_finalizer() -> None:
    """kopf adds its finalizer when any handler of a resource has requires_finalizer set: every
    timer and daemon, and deletion handlers that are not optional. Ours have none, so deleting a
    Campaign or its namespace never waits for the operator."""
    registry, _, _ = _registered()
    assert [h.id for h in _every_handler(registry) if getattr(h, "requires_finalizer", None)] == []

    # The check would see one: what kopf registers for a timer (why the tick is not a kopf timer).
    scratch = kopf.OperatorRegistry()
    kopf.timer("shardops.dev", "v1alpha1", "campaigns", interval=5, registry=scratch)(lambda **_: None)
    kopf.on.delete("shardops.dev", "v1alpha1", "campaigns", registry=scratch)(lambda **_: None)
    kopf.on.delete("shardops.dev", "v1alpha1", "shards", optional=True, registry=scratch)(lambda **_: None)
    flagged = [type(h).__name__ for h in _every_handler(scratch) if getattr(h, "requires_finalizer", None)]
    assert sorted(flagged) == ["ChangingHandler", "TimerHandler"]


def test_the_index_handler_starts_and_ends_the_tick_of_each_campaign() -> None:
    registry, ticker, _ = _registered()
    (index,) = [h for h in registry._watching.get_all_handlers() if h.id == "campaign-index"]

    async def events() -> list[set[tuple[str, str]]]:
        seen = []
        for type_, meta in [
            (None, {}),  # the first listing
            ("MODIFIED", {}),
            ("MODIFIED", {"deletionTimestamp": "2026-01-01T00:00:00Z"}),
            ("ADDED", {}),
            ("DELETED", {}),
        ]:
            body = kopf.Body({"metadata": {"name": "c", "namespace": "ns", **meta}})
            await index.fn(type=type_, namespace="ns", name="c", body=body)
            seen.append(ticker.known())
        await ticker.stop()
        return seen

    known = asyncio.run(events())
    assert known == [{("ns", "c")}, {("ns", "c")}, set(), {("ns", "c")}, set()]


def test_the_old_finalizer_handler_runs_only_for_campaigns_carrying_it() -> None:
    registry, _, operator = _registered()
    (handler,) = [h for h in registry._watching.get_all_handlers() if h.id == "old-finalizer"]
    carrying = {"metadata": {"name": "c", "namespace": "ns", "finalizers": ["x.io/keep", KOPF_FINALIZER]}}
    assert handler.when(body=kopf.Body(carrying)) is True
    assert handler.when(body=kopf.Body({"metadata": {"name": "c", "finalizers": ["x.io/keep"]}})) is False
    assert handler.when(body=kopf.Body({"metadata": {"name": "c"}})) is False

    operator.kube.put(CAMPAIGNS, "ns", carrying)  # type: ignore[attr-defined]
    handler.fn(type="DELETED", namespace="ns", name="c", body=kopf.Body(carrying))
    assert operator.kube.writes() == [], "a DELETED event's object is gone: nothing to patch"  # type: ignore[attr-defined]
    handler.fn(type=None, namespace="ns", name="c", body=kopf.Body(carrying))
    stored = operator.kube.obj(CAMPAIGNS, "ns", "c")  # type: ignore[attr-defined]
    assert stored["metadata"]["finalizers"] == ["x.io/keep"]
    assert operator.metrics.registry.get_sample_value("shardops_old_finalizers_removed_total") == 1


def test_kopf_keeps_its_bookkeeping_under_our_prefix_and_posts_no_events() -> None:
    configured = kopf_settings(settings())
    assert configured.persistence.finalizer == KOPF_FINALIZER == "shardops.dev/kopf-finalizer"
    assert configured.persistence.progress_storage.prefix == "shardops.dev"  # type: ignore[attr-defined]
    assert configured.posting.enabled is False and configured.peering.standalone is True
    assert configured.scanning.disabled is True


def test_the_handler_pool_has_the_configured_size_whatever_the_node() -> None:
    for threads in (16, 3):
        configured = kopf_settings(settings(reconcile_threads=threads))
        pool = configured.execution.executor
        assert isinstance(pool, ThreadPoolExecutor) and pool._max_workers == threads
        assert configured.execution.max_workers == threads
    assert settings().reconcile_threads == 16


def test_metrics_live_on_their_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.set_phases("ns/c", {ShardPhase.DONE: 3})
    assert first.registry.get_sample_value("shardops_shards", {"campaign": "ns/c", "phase": "Done"}) == 3
    assert second.registry.get_sample_value("shardops_shards", {"campaign": "ns/c", "phase": "Done"}) is None
    assert REGISTRY.get_sample_value("shardops_shards", {"campaign": "ns/c", "phase": "Done"}) is None
    first.forget_campaign("ns/c")
    assert first.registry.get_sample_value("shardops_shards", {"campaign": "ns/c", "phase": "Done"}) is None


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_metrics_and_health_endpoints() -> None:
    metrics = Metrics()
    metrics.observe_api("GET", "/api/v1/pods", 200)
    health = [(True, "leader")]
    server = metrics.serve("127.0.0.1", 0, lambda: health[0])
    try:
        code, text = _get(server.port, "/metrics")
        assert code == 200 and 'shardops_api_requests_total{code="200",verb="GET"} 1.0' in text
        assert (
            "shardops_reconcile_duration_seconds_bucket" in text
            or "shardops_reconcile_duration_seconds" in text
        )
        assert _get(server.port, "/healthz") == (200, "ok: leader\n")
        health[0] = (False, "event loop blocked for 30s")
        assert _get(server.port, "/healthz") == (503, "unhealthy: event loop blocked for 30s\n")
        assert _get(server.port, "/nope")[0] == 404
    finally:
        server.stop()


def test_loop_heartbeat_is_healthy_until_the_loop_stops_ticking() -> None:
    beat = LoopHeartbeat(stall_seconds=5)
    assert beat.healthy() and beat.age() == 0.0, "no loop yet: nothing to be stuck"
    beat.started = True
    beat.last -= 10
    assert not beat.healthy()
