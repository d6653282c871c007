"""Choosing what to claim: claim order, the head-of-queue spread, and every reason to skip or stop."""

from __future__ import annotations

import datetime as dt
import math
import random
from typing import Any

import pytest

from shardops.api.campaign import Campaign
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.k8s import leases
from shardops.k8s.api import LEASES
from shardops.logic.leases import Renewals
from shardops.logic.planner import plan_dispatch
from shardops.state import observe
from shardops.worker.claim import (
    Candidate,
    choose,
    exit_reason,
    expected_shards,
    is_zombie,
    lease_owner_reference,
    progress_of,
    stop_reason,
    uncut_shards,
    was_claimed,
)
from shardops.worker.observed import Observed
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE, T0, add_campaign, campaign_body

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


def _finalize_shard(phase: str) -> Shard:
    spec = {"campaign": "camp", "index": 2, "shardClass": "finalize", "idempotencyKey": "key-f"}
    return Shard.parse(
        {
            "metadata": {"name": "camp-finalize", "namespace": "ns", "uid": "uf"},
            "spec": spec,
            "status": {"phase": phase, "attempt": 1},
        }
    )


def _silences(shards: list[Shard]) -> dict[str, float]:
    """As a worker that watched them would have it: a Running shard whose leaseUntil passed has not been
    seen renewed for ever so long, the others were just seen renewed."""
    return {
        s.name: math.inf if s.current_status.lease_until and s.current_status.lease_until <= NOW else 0.0
        for s in shards
        if s.phase is ShardPhase.RUNNING
    }


def _choose(campaign: Campaign, shards: list[Shard], k: int = 100, seed: int = 1) -> list[Candidate]:
    return choose(campaign, shards, NOW, k, random.Random(seed), _silences(shards))


def _names(campaign: Campaign, shards: list[Shard], k: int = 100, seed: int = 1) -> list[str]:
    return [c.shard.name for c in _choose(campaign, shards, k, seed)]


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
    # This worker's silence decides, not the leaseUntil the holder wrote; only a Running shard can be one.
    assert is_zombie(alive, 30, 30) and not is_zombie(zombie, 29.9, 30)
    assert not is_zombie(_shard(2), 1e9, 30)
    found = _choose(campaign, [zombie, alive], 5, 0)
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
    found = {c.shard.name: c.source for c in _choose(campaign, shards, 10, 0)}
    assert found == {"camp-00000": "small", "camp-00002": "small"}


def test_stop_reasons() -> None:
    pending = [_shard(0), _shard(1)]
    assert stop_reason(_campaign(), pending) is None
    assert stop_reason(_campaign(suspend=True), pending) == "campaign is suspended"
    assert "out of budget" in (
        stop_reason(_campaign(budget={"limit": 1}, status={"spent": 2}), pending) or ""
    )
    # A worker lists only the unfinished shards; here shard 0 is Done (not listed), 1 Failed.
    unfinished = [_shard(1, "Failed")]
    assert "finished (1 of 2" in (stop_reason(_campaign(), unfinished) or "")
    # Not every shard is cut yet (the operator materializes gradually): more work is coming.
    six = _campaign(items=[{"id": i} for i in range(6)])
    assert stop_reason(six, unfinished) is None and uncut_shards(six, unfinished) == 1
    # The status's cursor counts too: shards cut and Done since are not listed.
    cut_all = _campaign(items=[{"id": i} for i in range(6)], status={"cutShards": 3})
    assert uncut_shards(cut_all, unfinished) == 0
    assert "finished (2 of 3" in (stop_reason(cut_all, unfinished) or "")
    # A finalize shard is part of the total; not listed, it is not cut yet or Done: the status says.
    with_finalize = _campaign(finalize={"image": "x", "command": ["report"]})
    assert expected_shards(with_finalize) == 3 and stop_reason(with_finalize, unfinished) is None
    finished = _campaign(finalize={"image": "x", "command": ["report"]}, status={"phase": "Completed"})
    assert "finished (2 of 3" in (stop_reason(finished, unfinished) or "")
    running_finalize = [*unfinished, _finalize_shard("Running")]
    assert stop_reason(finished, running_finalize) is None


def test_exit_reasons_name_a_gone_or_reapplied_campaign_else_its_stop_reason() -> None:
    assert exit_reason(None, "ns", "camp", None) == "campaign ns/camp does not exist"
    campaign = Campaign.parse({**campaign_body(), "metadata": {"name": "camp", "uid": "new"}})
    observed = Observed(campaign, [_shard(0)], fresh=True)
    reapplied = exit_reason(observed, "ns", "camp", "old") or ""
    assert "deleted and applied again (uid new, this worker's was old)" in reapplied
    assert exit_reason(observed, "ns", "camp", "new") is None
    assert exit_reason(observed, "ns", "camp", None) is None, "no uid to compare: the campaign's own reasons"
    suspended = Campaign.parse({**campaign_body(suspend=True), "metadata": {"name": "camp", "uid": "new"}})
    assert exit_reason(Observed(suspended, [_shard(0)], True), "ns", "camp", "new") == "campaign is suspended"


def test_each_source_waits_for_its_own_cooldown_not_the_longest() -> None:
    sources = [{"name": "quick", "cooldownSeconds": 10}, {"name": "slow", "cooldownSeconds": 600}]
    opened = (NOW - dt.timedelta(seconds=60)).isoformat()
    breakers = [
        {"source": "quick", "state": "Open", "consecutiveFailures": 3, "openedAt": opened},
        {"source": "slow", "state": "Open", "consecutiveFailures": 3, "openedAt": opened},
    ]
    campaign = _campaign(sources=sources, status={"breakers": breakers})
    shards = [_shard(0, source="quick"), _shard(1, source="quick"), _shard(2, source="slow")]
    # quick's cooldown ran out 50 s ago: HalfOpen, one probe. slow's has 540 s to go.
    found = {c.shard.name: c.source for c in _choose(campaign, shards, 10, 0)}
    assert found == {"camp-00000": "quick"}
    # A zombie of an open source is not taken over either while that source cools down.
    zombie = _shard(
        3, "Running", source="slow", owner="gone", leaseUntil=(NOW - dt.timedelta(seconds=1)).isoformat()
    )
    assert [c.shard.name for c in _choose(campaign, [zombie], 10, 0)] == []


def test_the_budget_gate_counts_what_the_shards_spent_when_the_status_lags() -> None:
    # The campaign status says nothing was spent yet, but the shards have reported 10 of 10.
    campaign = _campaign(budget={"limit": 10}, status={"spent": 0})
    spent = [_shard(0, "Done", cost=6.0), _shard(1, "Failed", cost=4.0)]
    pending = [
        _shard(2),
        _shard(3, "Running", owner="x", leaseUntil=(NOW - dt.timedelta(seconds=1)).isoformat()),
    ]
    assert _names(campaign, spent + pending) == []
    assert "out of budget (spent 10 of 10" in (stop_reason(campaign, spent + pending) or "")
    # At the warn ratio (8 of 10) work shards wait too.
    warn = [_shard(0, "Done", cost=8.0), _shard(2)]
    assert _names(campaign, warn) == [] and stop_reason(campaign, warn) is None
    # Below it, the same shards are claimable.
    assert _names(campaign, [_shard(0, "Done", cost=1.0), _shard(2)]) == ["camp-00002"]


def test_the_worker_offers_exactly_what_the_operator_plans_as_claimable() -> None:
    sources = [{"name": "A", "fallback": "B", "cooldownSeconds": 30}, {"name": "B"}]
    opened = (NOW - dt.timedelta(seconds=5)).isoformat()
    campaign = _campaign(
        items=[{"id": i} for i in range(20)],
        maxConcurrency=4,
        sources=sources,
        budget={"limit": 100},
        status={
            "spent": 1,
            "breakers": [{"source": "A", "state": "Open", "consecutiveFailures": 3, "openedAt": opened}],
        },
    )
    shards = [
        _shard(0, source="A"),
        _shard(1, source="B", cost=2.0),
        _shard(2, notBefore=(NOW + dt.timedelta(seconds=30)).isoformat()),
        _shard(3, "Running", owner="w", leaseUntil=(NOW + dt.timedelta(seconds=30)).isoformat()),
        _shard(4, priority=3),
        _shard(5),
        _shard(6),
    ]
    plan = plan_dispatch(observe.dispatch_inputs(campaign, shards, [], [], NOW, items_total=20))
    chosen = _choose(campaign, shards, 100, 0)
    assert sorted(c.shard.name for c in chosen) == sorted(plan.claimable)
    assert {c.shard.name: c.source for c in chosen}["camp-00000"] == plan.routes["camp-00000"].source == "B"


def test_progress() -> None:
    items = [{"id": 1}, {"id": 2}, {"id": 1}]
    from shardops.logic.idempotency import item_subkey

    progress = progress_of(items, {item_subkey({"id": 1})})
    assert (progress.done, progress.total) == (2, 3)


# --- the Lease of a shard never claimed: created without a read first -------------------------------


def test_a_never_claimed_shard_gets_its_lease_by_one_create_and_no_read() -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], shardSize=1))
    assert not was_claimed(shard)
    kube.calls.clear()
    seen = Renewals(lambda: 0.0)
    claim = leases.acquire(
        kube,  # type: ignore[arg-type]
        NAMESPACE,
        shard.lease_name,
        "w1",
        30,
        NOW,
        seen=seen,
        may_exist=was_claimed(shard),
    )
    assert claim is not None and claim.fencing_token == 1
    assert [(c.method, c.plural) for c in kube.calls] == [("POST", "leases")]


def test_a_lease_left_by_a_claimer_that_crashed_before_its_claim_write_is_read_and_judged() -> None:
    """Never claimed by its history, but the Lease exists: the create meets AlreadyExists and loses
    (no read: usually a racing worker just made it); asked again with may_exist, the Lease is read and
    decided on as usual — held: nobody else takes it; run out: taken over."""
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], shardSize=1))
    monotonic = [0.0]
    crashed, w2 = Renewals(lambda: monotonic[0]), Renewals(lambda: monotonic[0])
    name = shard.lease_name
    assert leases.acquire(kube, NAMESPACE, name, "crashed", 30, NOW, seen=crashed) is not None  # type: ignore[arg-type]
    kube.calls.clear()
    assert leases.acquire(kube, NAMESPACE, name, "w2", 30, NOW, seen=w2, may_exist=False) is None  # type: ignore[arg-type]
    assert [(c.method, c.plural, c.status) for c in kube.calls] == [("POST", "leases", 409)]
    # Read and judged: first seen now, by w2's clock — however old its renewTime looks.
    much_later = NOW + dt.timedelta(hours=1)
    assert leases.acquire(kube, NAMESPACE, name, "w2", 30, much_later, seen=w2, may_exist=True) is None  # type: ignore[arg-type]
    monotonic[0] = 29.0
    assert leases.acquire(kube, NAMESPACE, name, "w2", 30, much_later, seen=w2, may_exist=True) is None  # type: ignore[arg-type]
    monotonic[0] = 30.0
    taken = leases.acquire(kube, NAMESPACE, name, "w2", 30, much_later, seen=w2, may_exist=True)  # type: ignore[arg-type]
    assert taken is not None and (taken.holder, taken.fencing_token) == ("w2", 2)


def test_a_lease_held_for_an_earlier_shard_of_its_name_is_taken_over_at_once() -> None:
    """A Campaign deleted and applied again: the deleted Done shard's Lease (left held) is still
    there, owned by the old uid, until the garbage collector gets to it. The new shard's claimer takes
    it over at its first read, re-points it and moves the token on (the old holder is fenced); a
    Lease held for the shard itself, or judged without an owner, stays held."""
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], shardSize=1))
    name, now_owner = shard.lease_name, lease_owner_reference(shard)
    earlier_owner = {**now_owner, "uid": "uid-of-the-deleted-shard"}
    done_worker = leases.acquire(
        kube, NAMESPACE, name, "done", 30, NOW, earlier_owner, seen=Renewals(lambda: 0.0)
    )  # type: ignore[arg-type]
    assert done_worker is not None
    seen = Renewals(lambda: 0.0)
    assert leases.acquire(kube, NAMESPACE, name, "w2", 30, NOW, earlier_owner, seen=seen) is None  # type: ignore[arg-type]
    assert leases.acquire(kube, NAMESPACE, name, "w2", 30, NOW, None, seen=seen) is None  # type: ignore[arg-type]
    taken = leases.acquire(kube, NAMESPACE, name, "w2", 30, NOW, now_owner, seen=seen)  # type: ignore[arg-type]
    assert taken is not None and (taken.holder, taken.fencing_token) == ("w2", 2)
    assert kube.get(LEASES, NAMESPACE, name)["metadata"]["ownerReferences"] == [now_owner]
    with pytest.raises(leases.LeaseLost):
        leases.renew(kube, done_worker, NOW)  # type: ignore[arg-type]
    # Held for the shard now: the next claimer waits as for any live claim.
    assert leases.acquire(kube, NAMESPACE, name, "w3", 30, NOW, now_owner, seen=Renewals(lambda: 0.0)) is None  # type: ignore[arg-type]


def test_a_shard_claimed_before_counts_as_having_a_lease() -> None:
    assert was_claimed(
        _shard(
            0,
            "Pending",
            history=[{"phase": "Running", "at": "2026-01-01T00:00:00Z", "reason": "Claimed", "attempt": 1}],
        )
    )
    assert was_claimed(_shard(0, "Pending", attempt=2))
