"""Choosing what to claim: claim order, the head-of-queue spread, and every reason to skip or stop."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from shardops.api.campaign import Campaign
from shardops.api.shard import Shard
from shardops.worker.claim import choose, expected_shards, is_zombie, progress_of, stop_reason, view_of
from test_worker_support import T0, campaign_body

NOW = T0 + dt.timedelta(hours=1)


def _campaign(**spec: Any) -> Campaign:
    status = spec.pop("status", None)
    body = campaign_body(**spec)
    if status is not None:
        body["status"] = status
    return Campaign.parse(body)


def _shard(
    index: int, phase: str = "Pending", *, priority: int = 0, source: str | None = None, **status: Any
) -> Shard:
    spec: dict[str, Any] = {
        "campaign": "camp",
        "index": index,
        "items": [{"id": index}],
        "idempotencyKey": f"key-{index}",
        "priority": priority,
    }
    if source:
        spec["source"] = source
    return Shard.parse(
        {
            "metadata": {"name": f"camp-{index:05d}", "namespace": "ns", "uid": f"u{index}"},
            "spec": spec,
            "status": {"phase": phase, "attempt": 1, **status},
        }
    )


def _names(campaign: Campaign, shards: list[Shard], k: int = 100, seed: int = 1) -> list[str]:
    return [c.shard.name for c in choose(campaign, shards, NOW, k, random.Random(seed))]


def test_candidates_are_a_random_order_of_the_first_k_in_priority_then_fifo_order() -> None:
    campaign = _campaign(items=[{"id": i} for i in range(20)], maxConcurrency=50)
    shards = [_shard(i) for i in range(10)] + [_shard(10, priority=5), _shard(11, priority=5)]
    heads = {tuple(sorted(_names(campaign, shards, k=4, seed=seed))) for seed in range(30)}
    assert heads == {("camp-00000", "camp-00001", "camp-00010", "camp-00011")}
    orders = {tuple(_names(campaign, shards, k=4, seed=seed)) for seed in range(30)}
    assert len(orders) > 1, "workers must not all try the same shard first"


def test_skips_backoff_running_done_and_respects_max_concurrency() -> None:
    campaign = _campaign(items=[{"id": i} for i in range(10)], maxConcurrency=3)
    shards = [
        _shard(0, notBefore=(NOW + dt.timedelta(seconds=30)).isoformat()),
        _shard(1, notBefore=(NOW - dt.timedelta(seconds=30)).isoformat()),
        _shard(2, "Running", owner="w", leaseUntil=(NOW + dt.timedelta(seconds=30)).isoformat()),
        _shard(3, "Done"),
        _shard(4),
        _shard(5),
        _shard(6),
    ]
    # One running of at most three: two free slots, in FIFO order.
    assert sorted(_names(campaign, shards)) == ["camp-00001", "camp-00004"]


def test_an_expired_lease_makes_a_running_shard_a_candidate() -> None:
    campaign = _campaign(items=[{"id": i} for i in range(4)])
    zombie = _shard(0, "Running", owner="gone", leaseUntil=(NOW - dt.timedelta(seconds=1)).isoformat())
    alive = _shard(1, "Running", owner="w", leaseUntil=(NOW + dt.timedelta(seconds=5)).isoformat())
    assert is_zombie(zombie, NOW) and not is_zombie(alive, NOW)
    found = choose(campaign, [zombie, alive], NOW, 5, random.Random(0))
    assert [(c.shard.name, c.zombie) for c in found] == [("camp-00000", True)]


def test_suspended_or_exhausted_campaigns_offer_nothing() -> None:
    shards = [
        _shard(0),
        _shard(1, "Running", owner="x", leaseUntil=(NOW - dt.timedelta(seconds=1)).isoformat()),
    ]
    assert _names(_campaign(suspend=True), shards) == []
    exhausted = _campaign(budget={"limit": 10}, status={"spent": 10})
    assert _names(exhausted, shards) == []
    # At the warn ratio only finalize shards start: this work shard waits.
    warn = _campaign(budget={"limit": 10, "warnRatio": 0.5}, status={"spent": 6})
    assert _names(warn, shards) == []


def test_an_open_breaker_routes_to_the_fallback_or_holds_the_shard() -> None:
    sources = [{"name": "big", "fallback": "small"}, {"name": "small"}, {"name": "solo"}]
    opened = (NOW - dt.timedelta(seconds=10)).isoformat()
    breakers = [
        {"source": "big", "state": "Open", "consecutiveFailures": 3, "openedAt": opened},
        {"source": "solo", "state": "Open", "consecutiveFailures": 3, "openedAt": opened},
    ]
    campaign = _campaign(sources=sources, status={"breakers": breakers})
    shards = [_shard(0, source="big"), _shard(1, source="solo"), _shard(2, source="small")]
    found = {c.shard.name: c.source for c in choose(campaign, shards, NOW, 10, random.Random(0))}
    assert found == {"camp-00000": "small", "camp-00002": "small"}


def test_stop_reasons() -> None:
    pending = [_shard(0), _shard(1)]
    assert stop_reason(_campaign(), pending) is None
    assert stop_reason(_campaign(suspend=True), pending) == "campaign is suspended"
    assert "out of budget" in (
        stop_reason(_campaign(budget={"limit": 1}, status={"spent": 2}), pending) or ""
    )
    done = [_shard(0, "Done"), _shard(1, "Failed")]
    assert "finished (1 of 2" in (stop_reason(_campaign(), done) or "")
    # Not all shards exist yet (the operator materializes gradually): not finished.
    assert stop_reason(_campaign(items=[{"id": i} for i in range(6)]), done) is None
    # A finalize shard is part of the total.
    with_finalize = _campaign(finalize={"image": "x", "command": ["report"]})
    assert expected_shards(with_finalize) == 3 and stop_reason(with_finalize, done) is None


def test_view_and_progress() -> None:
    shard = _shard(
        3,
        priority=2,
        cost=1.5,
        history=[{"phase": "Pending", "at": T0.isoformat(), "reason": "Materialized"}],
    )
    view = view_of(shard, NOW)
    assert (view.index, view.priority, view.cost, view.since) == (3, 2, 1.5, T0)
    items = [{"id": 1}, {"id": 2}, {"id": 1}]
    from shardops.logic.idempotency import item_subkey

    progress = progress_of(items, {item_subkey({"id": 1})})
    assert (progress.done, progress.total) == (2, 3)
