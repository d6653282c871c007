"""Workers that look for work through watches (`k8s.informer`, `worker.observed.WatchedObserver`), against
the in-memory API server's watch: the copy follows every change, a look costs no request, a waiting
worker wakes on a change that may matter and not on a heartbeat, and an exit is confirmed on a
fresh read."""

from __future__ import annotations

import datetime as dt
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from shardops.api.campaign import Campaign
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.k8s import leases
from shardops.k8s.api import CAMPAIGNS, LEASES, SHARDS, Gone, json_lines, watch_event
from shardops.k8s.informer import Changes, Informer
from shardops.k8s.shards import unfinished_query
from shardops.logic.leases import Renewals
from shardops.worker.holding import Outcome
from shardops.worker.observed import (
    Observed,
    Wake,
    WatchedObserver,
    campaign_change_matters,
    own,
    read_observed,
    shard_change_matters,
)
from shardops.worker.runtime import LOST_CLAIM_SECONDS, MAX_SPREAD_SECONDS, SPREAD_SECONDS
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE, add_campaign, campaign_body, held_by_another, worker

AGENT = [sys.executable, "-m", "shardops_example_agent.agent"]


def _until(changes: Changes, seen: int, done: Any) -> None:
    """Wait on the informer's own signal until `done()` holds (bounded: a hang fails the test)."""
    for _ in range(200):
        if done():
            return
        seen = changes.wait(seen, 0.05)
    raise AssertionError("the watched copy never showed the change")


def _phase(kube: FakeKube, name: str, phase: str) -> None:
    body = kube.obj(SHARDS, NAMESPACE, name)
    assert body is not None
    kube.put(SHARDS, NAMESPACE, {**body, "status": {**(body.get("status") or {}), "phase": phase}})


def _phase_in(bodies: list[dict[str, Any]], name: str) -> object:
    found = [b for b in bodies if b["metadata"]["name"] == name]
    return (found[0].get("status") or {}).get("phase") if found else None


def test_a_watch_stream_is_read_line_by_line_whatever_its_chunks_cut() -> None:
    stream = b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n{"type":"BOOKMARK","object":{}}\n'
    chunks = [stream[:7], stream[7:40], stream[40:41], stream[41:]]
    assert [line["type"] for line in json_lines(chunks)] == ["ADDED", "BOOKMARK"]
    assert [line["type"] for line in json_lines([stream.rstrip(b"\n")])] == ["ADDED", "BOOKMARK"]


def test_a_watch_error_line_raises_what_its_status_says() -> None:
    with pytest.raises(Gone):
        watch_event({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}})
    event = watch_event({"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "7"}}})
    assert (event.type, event.resource_version) == ("ADDED", "7")


def test_the_informer_follows_the_window_and_wakes_only_on_changes_that_matter() -> None:
    kube = FakeKube()
    shards = add_campaign(kube, campaign_body(items=[{"id": i} for i in range(6)]))
    changes = Changes()
    informer = Informer(
        kube,
        SHARDS,
        NAMESPACE,
        unfinished_query("camp"),
        changes,
        matters=shard_change_matters,
        watch_seconds=5,
    )
    informer.start()
    try:
        assert informer.wait_synced(5)
        names = lambda: sorted(b["metadata"]["name"] for b in informer.objects())  # noqa: E731
        assert names() == [s.name for s in shards]
        # A heartbeat-like write (same phase) is followed but wakes nobody.
        seen = changes.count
        body = kube.obj(SHARDS, NAMESPACE, shards[0].name)
        assert body is not None
        kube.put(SHARDS, NAMESPACE, {**body, "status": {**body["status"], "cost": 1.5}})
        _until(
            changes, seen, lambda: any((b.get("status") or {}).get("cost") == 1.5 for b in informer.objects())
        )
        assert changes.count == seen, "a change of a field the plan does not read woke the readers"
        # Claimed by someone: followed, but nothing new to claim.
        _phase(kube, shards[1].name, ShardPhase.RUNNING)
        _until(changes, seen, lambda: _phase_in(informer.objects(), shards[1].name) == ShardPhase.RUNNING)
        assert changes.count == seen, "another worker's claim woke the readers"
        # A running shard that turns Done leaves the window (DELETED from the selector) and frees a slot.
        _phase(kube, shards[1].name, ShardPhase.DONE)
        _until(changes, seen, lambda: shards[1].name not in names())
        assert changes.count > seen
        # A new shard appears, Pending.
        seen = changes.count
        kube.put(SHARDS, NAMESPACE, {**body, "metadata": {**body["metadata"], "name": "camp-00099"}})
        _until(changes, seen, lambda: "camp-00099" in names())
        assert changes.count > seen
    finally:
        informer.stop()


def test_watched_looks_read_nothing_per_look_and_parse_only_what_changed() -> None:
    kube = FakeKube()
    shards = add_campaign(kube, campaign_body(items=[{"id": i} for i in range(6)]))
    looks = WatchedObserver(kube, NAMESPACE, "camp")  # type: ignore[arg-type]
    try:
        first = looks.observe()
        assert not first.fresh and first.campaign.name == "camp"
        assert sorted(s.name for s in first.unfinished) == [s.name for s in shards]
        reads = [c for c in kube.calls if c.method in ("GET", "LIST")]
        for _ in range(20):
            again = looks.observe()
        assert [c for c in kube.calls if c.method in ("GET", "LIST")] == reads, "a look sent a request"
        # The same parsed objects while nothing changed: a look parses only what changed.
        assert [id(s) for s in again.unfinished] == [id(s) for s in first.unfinished]
        seen = looks.changes.count
        _phase(kube, shards[0].name, ShardPhase.RUNNING)
        _until(
            looks.changes,
            seen,
            lambda: (
                {s.name: s.phase for s in looks.observe().unfinished}[shards[0].name] is ShardPhase.RUNNING
            ),
        )
        changed = {s.name: s for s in looks.observe().unfinished}
        assert changed[shards[0].name] is not first.unfinished[0]
        assert changed[shards[2].name] is {s.name: s for s in first.unfinished}[shards[2].name]
    finally:
        looks.close()


def test_a_waiting_worker_wakes_when_a_shard_appears_not_at_its_poll(tmp_path: Path) -> None:
    kube = FakeKube()
    add_campaign(kube, campaign_body(items=[{"id": 0}]))
    looks = WatchedObserver(kube, NAMESPACE, "camp")  # type: ignore[arg-type]
    try:
        looks.observe()
        stop = threading.Event()
        woke: list[bool] = []
        # The wait counts changes from the look on, so the put may land before the wait begins.
        waiter = threading.Thread(target=lambda: woke.append(looks.wait(30.0, stop)))
        waiter.start()
        body = kube.obj(SHARDS, NAMESPACE, "camp-00000")
        assert body is not None
        kube.put(SHARDS, NAMESPACE, {**body, "metadata": {**body["metadata"], "name": "camp-00001"}})
        waiter.join(10)
        assert not waiter.is_alive(), "the wait went on past a new shard"
        assert woke == [Wake.CHANGE]
    finally:
        looks.close()


def test_a_worker_on_watches_runs_every_shard_and_exits_on_a_fresh_read(tmp_path: Path) -> None:
    kube = FakeKube()
    shards = add_campaign(
        kube, campaign_body(items=[{"id": i} for i in range(6)], worker={"image": "x", "command": AGENT})
    )
    runner = worker(kube, tmp_path, observer=WatchedObserver(kube, NAMESPACE, "camp"))  # type: ignore[arg-type]
    assert runner.run() == 0
    for shard in shards:
        stored = kube.obj(SHARDS, NAMESPACE, shard.name)
        assert stored is not None and stored["status"]["phase"] == ShardPhase.DONE
    # Observer came from the watches: the only reads of the Campaign and of shard lists are the
    # watches' first lists and the fresh read that confirmed the exit.
    campaign_gets = [
        c for c in kube.calls if c.method == "GET" and c.path == CAMPAIGNS.path(NAMESPACE, "camp")
    ]
    lists = [c for c in kube.calls if c.method == "LIST" and c.path == SHARDS.path(NAMESPACE)]
    assert len(campaign_gets) == 1 and len(lists) == 2, (len(campaign_gets), len(lists))


def test_a_worker_does_not_exit_on_a_copy_that_lags(tmp_path: Path) -> None:
    """The watched copy has no Campaign (it missed it), the API server has one: the fresh read that
    confirms an exit disagrees, so the worker works instead of leaving."""
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], worker={"image": "x", "command": AGENT}))
    looks = WatchedObserver(kube, NAMESPACE, "camp")  # type: ignore[arg-type]
    looks.observe()
    looks.close()
    looks.campaign._objects.clear()  # stopped, the copy stays without its Campaign
    runner = worker(kube, tmp_path, observer=looks)
    assert runner._step() is Outcome.DONE
    assert Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {}).phase is ShardPhase.DONE


def test_a_worker_does_not_leave_for_want_of_work_on_a_copy_that_lags(tmp_path: Path) -> None:
    """The watched copy holds the campaign's one shard as backing off (its notBefore an hour ahead);
    the API server has it Pending now. With no idle time (idleSeconds 0), nothing claimable in the
    copy is no reason to leave yet: the worker reads, finds the shard, and runs it. (Before, it left
    at once: "no claimable shard for 0s", the shard left Pending. A worker whose copy lagged the
    event of its own last Done write left that way too, without the read that confirms an exit.)"""
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], worker={"image": "x", "command": AGENT}))
    looks = WatchedObserver(kube, NAMESPACE, "camp")  # type: ignore[arg-type]
    looks.observe()
    looks.close()  # stopped, the copy stays as it is set here
    lagging = looks.shards._objects[shard.name]
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    lagging["status"]["notBefore"] = later.isoformat().replace("+00:00", "Z")
    lagging["metadata"]["resourceVersion"] = "1"  # an older version: parsed again, not taken from the cache
    runner = worker(kube, tmp_path, observer=looks)
    assert runner.run() == 0
    assert Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {}).phase is ShardPhase.DONE
    campaign_gets = [
        c for c in kube.calls if c.method == "GET" and c.path == CAMPAIGNS.path(NAMESPACE, "camp")
    ]
    assert len(campaign_gets) == 2, "one read found the shard, one confirmed there was nothing left"


def test_a_lost_claim_is_not_tried_again_until_the_shard_changes(tmp_path: Path) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], worker={"image": "x", "command": AGENT}))
    looks = WatchedObserver(kube, NAMESPACE, "camp")  # type: ignore[arg-type]
    try:
        looks.observe()
        looks.close()  # the copy stops here: it never sees the winner's claim
        # Another worker holds the shard's Lease (its claim write has not landed).
        now = dt.datetime.now(dt.UTC)
        assert (
            leases.acquire(kube, NAMESPACE, shard.lease_name, "other", 30, now, seen=Renewals(lambda: 0.0))
            is not None
        )  # type: ignore[arg-type]
        runner = worker(kube, tmp_path, observer=looks)
        assert runner._step() is None
        lease_reads = lambda: [c for c in kube.calls if c.plural == "leases"]  # noqa: E731
        tried = len(lease_reads())
        assert tried >= 1
        for _ in range(5):
            assert runner._step() is None
        assert len(lease_reads()) == tried, "the lost shard was tried again at the same version"
        assert Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {}).phase is ShardPhase.PENDING
    finally:
        looks.close()


def test_campaign_changes_wake_workers_only_when_they_may_gate_claims() -> None:
    base = {"metadata": {"name": "camp", "generation": 1}, "status": {"counts": {"done": 1}, "spent": 1.0}}
    figures = {**base, "status": {"counts": {"done": 2}, "spent": 2.0, "oldestPendingSeconds": 3}}
    assert not campaign_change_matters(base, figures)
    breaker = {**base, "status": {**base["status"], "breakers": [{"source": "a", "state": "Closed"}]}}
    assert campaign_change_matters(base, breaker)
    edited = {**base, "metadata": {"name": "camp", "generation": 2}}
    assert campaign_change_matters(base, edited)
    assert campaign_change_matters(None, base) and campaign_change_matters(base, None)


class SteppedClock:
    def __init__(self) -> None:
        self.at = dt.datetime.now(dt.UTC)
        self.mono = 0.0

    def now(self) -> dt.datetime:
        return self.at

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.at += dt.timedelta(seconds=seconds)
        self.mono += seconds


def test_a_shard_whose_claimer_crashed_before_its_claim_write_is_claimed_once_its_lease_runs_out(
    tmp_path: Path,
) -> None:
    """Pending and never claimed by its history, but its Lease is held by a claimer that died before
    writing the claim: the worker's create loses (no read), then, after LOST_CLAIM_SECONDS, it reads
    the Lease and waits it out, and takes it over once it ran out."""
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], worker={"image": "x", "command": AGENT}))
    clock = SteppedClock()
    crashed = Renewals(clock.monotonic)
    assert (
        leases.acquire(kube, NAMESPACE, shard.lease_name, "crashed", 10, clock.now(), seen=crashed)
        is not None
    )  # type: ignore[arg-type]
    runner = worker(kube, tmp_path, clock=clock)
    assert runner._step() is None
    clock.advance(LOST_CLAIM_SECONDS + 1)
    kube.calls.clear()
    assert runner._step() is None
    assert ("GET", "leases") in [(c.method, c.plural) for c in kube.calls], "the Lease was not read"
    clock.advance(10)
    assert runner._step() is Outcome.DONE
    assert Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {}).phase is ShardPhase.DONE


def test_a_worker_never_takes_over_a_holder_whose_clock_runs_behind_while_it_renews(tmp_path: Path) -> None:
    """The holder's clock is 30 s behind the worker's (its leaseSeconds): every leaseUntil and renewTime
    it writes has passed by the worker's clock the moment it is written. The worker judges on its own
    clock from when it saw each renewal: no takeover while the holder renews, one a lease duration
    after it stops."""
    kube = FakeKube()
    body = campaign_body(items=[{"id": 0}], leaseSeconds=30, worker={"image": "x", "command": AGENT})
    (shard,) = add_campaign(kube, body)
    clock = SteppedClock()
    behind = dt.timedelta(seconds=30)

    def holder_renews() -> None:
        holder_now = clock.now() - behind
        lease = kube.obj(LEASES, NAMESPACE, shard.lease_name)
        assert lease is not None and lease["spec"]["holderIdentity"] == "slow-clock"
        lease["spec"]["renewTime"] = leases.format_micro_time(holder_now)
        kube.put(LEASES, NAMESPACE, lease)
        current = kube.obj(SHARDS, NAMESPACE, shard.name) or {}
        until = (holder_now + dt.timedelta(seconds=30)).isoformat()
        status = {
            **current["status"],
            "phase": "Running",
            "owner": "slow-clock",
            "attempt": 1,
            "leaseUntil": until,
        }
        kube.put(SHARDS, NAMESPACE, {**current, "status": status})

    slow = Renewals(lambda: 0.0)
    claim = leases.acquire(
        kube, NAMESPACE, shard.lease_name, "slow-clock", 30, clock.now() - behind, seen=slow
    )  # type: ignore[arg-type]
    assert claim is not None
    holder_renews()
    runner = worker(kube, tmp_path, clock=clock, idle_seconds=3600)
    for step in range(24):  # two minutes, a renewal every 10 s
        assert runner._step() is None, f"took the live claim over at step {step}"
        clock.advance(5)
        if step % 2:
            holder_renews()
    final = Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {}).current_status
    assert (final.owner, final.attempt) == ("slow-clock", 1)
    # It stops renewing: a lease duration after the worker last saw it renew, the worker reclaims and
    # runs the shard.
    assert runner._step() is None
    clock.advance(29)
    assert runner._step() is None
    clock.advance(1)
    assert runner._step() is Outcome.DONE
    done = Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {}).current_status
    assert (done.phase, done.attempt) == (ShardPhase.DONE, 2)


def test_a_shard_whose_index_the_campaign_folded_is_never_worked_on(tmp_path: Path) -> None:
    """A stale re-creation: an operator replica's create, in flight when it lost leadership, landed
    after the new leader had folded and deleted that shard. Workers leave it to the leader."""
    kube = FakeKube()
    body = campaign_body(items=[{"id": 0}, {"id": 1}], shardSize=1, worker={"image": "x", "command": AGENT})
    body["status"] = {"folded": {"shards": 1, "items": 1, "doneRanges": [{"start": 0, "end": 1}]}}
    stale, live = add_campaign(kube, body)
    runner = worker(kube, tmp_path)
    assert runner._step() is Outcome.DONE
    assert Shard.parse(kube.obj(SHARDS, NAMESPACE, live.name) or {}).phase is ShardPhase.DONE
    assert Shard.parse(kube.obj(SHARDS, NAMESPACE, stale.name) or {}).phase is ShardPhase.PENDING
    assert kube.obj(LEASES, NAMESPACE, stale.lease_name) is None, "never even tried"


def _held_by_another(kube: FakeKube, shard: Shard, clock: SteppedClock) -> None:
    held_by_another(kube, shard, clock.now(), clock.monotonic)


def test_a_lost_race_ends_the_look_and_widens_the_spread_and_a_win_narrows_it(tmp_path: Path) -> None:
    """Workers that keep colliding space their looks further apart (binary exponential backoff): a
    lost claim doubles the worker's spread and ends the look — the other candidates of that look
    are likely raced for too — and a claim won halves it, never below SPREAD_SECONDS."""
    kube = FakeKube()
    body = campaign_body(
        items=[{"id": i} for i in range(3)], shardSize=1, worker={"image": "x", "command": AGENT}
    )
    shards = add_campaign(kube, body)  # three shards: three races to lose, one look each
    clock = SteppedClock()
    for shard in shards:
        _held_by_another(kube, shard, clock)
    runner = worker(kube, tmp_path, clock=clock)
    kube.calls.clear()
    assert runner._step() is None
    creates = [c for c in kube.calls if (c.method, c.plural) == ("POST", "leases")]
    assert len(creates) == 1, "a look went on to its other candidates after a lost race"
    assert runner._lost_last and runner._spread == 2 * SPREAD_SECONDS
    assert runner._step() is None
    assert runner._spread == 4 * SPREAD_SECONDS
    runner._spread = 0.8 * MAX_SPREAD_SECONDS
    assert runner._step() is None
    assert runner._spread == MAX_SPREAD_SECONDS, "the spread grew past its bound"
    for shard in shards:
        kube.delete(LEASES, NAMESPACE, shard.lease_name)
    clock.advance(LOST_CLAIM_SECONDS + 1)
    assert runner._step() is Outcome.DONE
    assert not runner._lost_last and runner._spread == MAX_SPREAD_SECONDS / 2


class _RecordedObserver(WatchedObserver):
    woke: list[Wake]

    def wait(self, seconds: float, stop: threading.Event) -> Wake:
        woke = super().wait(seconds, stop)
        self.woke.append(woke)
        return woke


def test_a_change_that_leaves_no_pending_shard_to_try_does_not_end_the_wait(tmp_path: Path) -> None:
    """A waiting worker woken by a change asks the watched copy, without a look, whether a shard it
    did not just lose is Pending: a slot coming free while the only Pending shard is one it lost a
    moment ago keeps it waiting (to its timeout here); a new shard ends the wait."""
    kube = FakeKube()
    body = campaign_body(
        items=[{"id": i} for i in range(2)], shardSize=1, worker={"image": "x", "command": AGENT}
    )
    lost, running = add_campaign(kube, body)
    clock = SteppedClock()
    _held_by_another(kube, lost, clock)
    looks = _RecordedObserver(kube, NAMESPACE, "camp")  # type: ignore[arg-type]
    looks.woke = []
    runner = worker(kube, tmp_path, clock=clock, observer=looks)
    try:
        _phase(kube, running.name, ShardPhase.RUNNING)
        _until(
            looks.changes, 0, lambda: _phase_in(looks.shards.objects(), running.name) == ShardPhase.RUNNING
        )
        assert runner._step() is None and runner._lost_last  # lost `lost`, the only Pending one
        _phase(kube, running.name, ShardPhase.DONE)  # a slot came free: a change that matters
        runner.wait_for_work(0.5)
        assert looks.woke == [Wake.CHANGE, Wake.TIMEOUT]
        looks.woke.clear()
        added = kube.obj(SHARDS, NAMESPACE, running.name)
        assert added is not None
        fresh = {
            **added,
            "metadata": {**added["metadata"], "name": "camp-00009"},
            "status": {"phase": "Pending"},
        }
        kube.put(SHARDS, NAMESPACE, fresh)
        runner.wait_for_work(30.0)
        assert looks.woke == [Wake.CHANGE], "a new Pending shard did not end the wait"
    finally:
        looks.close()


def test_a_shard_without_a_status_is_left_out_of_the_watch_until_it_is_pending() -> None:
    """Every event of a watched shard goes to every worker: the one of a shard just created (no status,
    not claimable) is not sent. The write that makes it Pending brings it in and wakes a waiter; a
    fresh read (`read_observed`, which confirms exits) sees it all along."""
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}]))
    looks = WatchedObserver(kube, NAMESPACE, "camp")  # type: ignore[arg-type]
    try:
        looks.observe()
        body = kube.obj(SHARDS, NAMESPACE, shard.name)
        assert body is not None
        created = {k: v for k, v in body.items() if k != "status"}
        created["metadata"] = {**body["metadata"], "name": "camp-00001"}
        seen = looks.changes.count
        kube.put(SHARDS, NAMESPACE, created)
        kube.put(SHARDS, NAMESPACE, {**body, "metadata": {**body["metadata"], "name": "camp-00002"}})
        _until(looks.changes, seen, lambda: "camp-00002" in {s.name for s in looks.observe().unfinished})
        assert "camp-00001" not in {s.name for s in looks.observe().unfinished}
        assert "camp-00001" in {s.name for s in read_observed(kube, NAMESPACE, "camp").unfinished}  # type: ignore[arg-type]
        seen = looks.changes.count
        _phase(kube, "camp-00001", ShardPhase.PENDING)
        _until(looks.changes, seen, lambda: "camp-00001" in {s.name for s in looks.observe().unfinished})
    finally:
        looks.close()


def test_own_keeps_the_campaigns_unfolded_shards_only() -> None:
    """A shard of a deleted incarnation (another controller uid) or of a folded index is not worked on."""
    campaign = Campaign.parse(
        {
            **campaign_body(),
            "metadata": {"name": "camp", "uid": "u1"},
            "status": {"folded": {"doneRanges": [{"start": 0, "end": 1}]}},
        }
    )

    def shard(index: int, owner: str) -> Shard:
        reference = {"apiVersion": "shardops.dev/v1alpha1", "kind": "Campaign", "name": "camp", "uid": owner}
        metadata = {"name": f"camp-{index:05d}", "ownerReferences": [{**reference, "controller": True}]}
        spec = {"campaign": "camp", "index": index, "items": [{"id": index}], "idempotencyKey": f"k{index}"}
        return Shard.parse({"metadata": metadata, "spec": spec})

    folded, live, stale = shard(0, "u1"), shard(1, "u1"), shard(2, "u0")
    kept = own(Observed(campaign, [folded, live, stale], fresh=False))
    assert [s.name for s in kept.unfinished] == [live.name] and kept.campaign is campaign and not kept.fresh
