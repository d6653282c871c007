"""A worker process of several slots (spec.worker.slots; `runtime.run_slots`, `SlotGroup`): each slot
claims and runs its own shard at the same time as the others, under its own holder identity, the
slots share one pair of watches and never race each other for a shard, and the process leaves only
when all its slots are idle."""

from __future__ import annotations

import datetime as dt
import sys
import threading
from pathlib import Path

import pytest

from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.k8s.api import LEASES, SHARDS, ApiError
from shardops.worker.metrics import WorkerMetrics
from shardops.worker.observed import WatchedObserver, Watches
from shardops.worker.runtime import Worker
from shardops.worker.settings import IDENTITY_MAX, WorkerSettings
from shardops.worker.slots import SlotGroup, run_slots
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE, add_campaign, campaign_body, worker_settings

# Every shard's command waits until $EXPECTED shards' commands have started (a file each in
# $MEET_DIR), then answers its items; after $PATIENCE seconds without them it fails. So the shards
# end Done only if that many ran at the same time.
MEETING = [
    sys.executable,
    "-c",
    "import json, os, pathlib, sys, time\n"
    "meet = pathlib.Path(os.environ['MEET_DIR'])\n"
    "items = [json.loads(line) for line in open(os.environ['SHARDOPS_ITEMS_FILE'])]\n"
    "(meet / str(items[0]['item']['id'])).touch()\n"
    "deadline = time.monotonic() + float(os.environ['PATIENCE'])\n"
    "while len(list(meet.iterdir())) < int(os.environ['EXPECTED']):\n"
    "    if time.monotonic() > deadline:\n"
    "        sys.exit(1)\n"
    "    time.sleep(0.01)\n"
    "with open(os.environ['SHARDOPS_RESULTS_FILE'], 'a') as out:\n"
    "    for item in items:\n"
    "        out.write(json.dumps({'key': item['key'], 'result': item['item']['id']}) + '\\n')\n",
]


def _slots(kube: FakeKube, tmp_path: Path, count: int, **settings: object) -> tuple[list[Worker], Watches]:
    """`count` slots of one process, wired as `worker.main.run_worker` wires them."""
    values = worker_settings(tmp_path, slots=count, **settings)
    group = SlotGroup(WorkerMetrics(f"{NAMESPACE}/camp"))
    watches = Watches(kube, NAMESPACE, "camp")  # type: ignore[arg-type]
    stop = threading.Event()
    slots = [
        Worker(
            kube=kube,  # type: ignore[arg-type]
            settings=values,
            namespace=NAMESPACE,
            campaign_name="camp",
            stop=stop,
            slot=slot,
            group=group,
            observer=WatchedObserver(kube, NAMESPACE, "camp", watches),  # type: ignore[arg-type]
        )
        for slot in range(count)
    ]
    return slots, watches


def _meeting_campaign(kube: FakeKube, tmp_path: Path, shards: int, patience: float = 20) -> list[Shard]:
    meet = tmp_path / "meet"
    meet.mkdir()
    env = [
        {"name": "MEET_DIR", "value": str(meet)},
        {"name": "EXPECTED", "value": str(shards)},
        {"name": "PATIENCE", "value": str(patience)},
    ]
    body = campaign_body(
        items=[{"id": i} for i in range(2 * shards)],
        maxConcurrency=shards,
        worker={"image": "x", "command": MEETING, "env": env},
    )
    return add_campaign(kube, body)


def _owners(kube: FakeKube, shard: Shard) -> set[str]:
    stored = Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {})
    assert stored.phase is ShardPhase.DONE, (shard.name, stored.phase, stored.current_status.last_error)
    return {e.owner for e in stored.current_status.history if e.phase is ShardPhase.RUNNING and e.owner}


def test_three_slots_of_one_process_run_three_shards_at_once_each_under_its_own_holder(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    shards = _meeting_campaign(kube, tmp_path, 3)
    slots, watches = _slots(kube, tmp_path, 3, idle_seconds=1)
    try:
        assert run_slots(slots) == 0
    finally:
        watches.close()
    owners = [_owners(kube, shard) for shard in shards]
    assert all(len(o) == 1 for o in owners), owners
    holders = {slot.holder for slot in slots}
    assert set().union(*owners) == holders and len(holders) == 3, "each shard by another slot"
    assert slots[0].holder == slots[0].settings.identity, "slot 0 holds as a worker of one slot does"
    # One pair of watches for the three slots: one list (its first), however many looks, and one
    # fresh read by each slot to confirm its exit.
    lists = [c for c in kube.calls if c.method == "LIST" and c.path == SHARDS.path(NAMESPACE)]
    assert len(lists) <= 1 + 3, len(lists)


def test_with_one_slot_the_same_shards_cannot_meet_and_fail(tmp_path: Path) -> None:
    """The control of the test above: its command really needs the slots to run at once."""
    kube = FakeKube()
    shards = _meeting_campaign(kube, tmp_path, 2, patience=1)
    slots, watches = _slots(kube, tmp_path, 1, max_shards=1)
    try:
        assert run_slots(slots) == 0
    finally:
        watches.close()
    stored = [Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {}) for shard in shards]
    assert not any(s.phase is ShardPhase.DONE for s in stored)
    failed = [s for s in stored if s.current_status.last_error is not None]
    assert len(failed) == 1, "the one shard it ran waited for the other in vain"


def test_slots_never_race_each_other_for_a_shard(tmp_path: Path) -> None:
    """Eight slots, four one-item shards of no work: one slot at a time claims, and a claim a
    sibling won is passed by, so no Lease create of the process is refused."""
    kube = FakeKube()
    body = campaign_body(
        items=[{"id": i} for i in range(4)],
        shardSize=1,
        worker={"image": "x", "command": [sys.executable, "-m", "shardops_example_agent.agent"]},
    )
    shards = add_campaign(kube, body)
    slots, watches = _slots(kube, tmp_path, 8)
    try:
        assert run_slots(slots) == 0
    finally:
        watches.close()
    for shard in shards:
        assert len(_owners(kube, shard)) == 1
    creates = [c for c in kube.calls if c.method == "POST" and c.plural == "leases"]
    refused = [c for c in creates if c.status == 409]
    assert len(creates) == len(shards) and not refused, [(c.path, c.status) for c in creates]


def test_a_slot_lets_its_siblings_claim_once_its_shard_is_reserved(tmp_path: Path) -> None:
    """The claim lock covers the look and the choice, not the Lease create (nor the claim's status
    write, nor the run): when a slot creates the Lease of the shard it chose, the lock is free, and
    the shard is passed by as reserved; when it writes its claim, the shard is still passed by."""
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], shardSize=1))
    slots, watches = _slots(kube, tmp_path, 2, max_shards=1)
    seen: list[tuple[object, bool, bool]] = []

    def at_the_claim(_kube: FakeKube, verb: str, resource: object, name: str) -> None:
        if resource in (LEASES, SHARDS) and name in (shard.lease_name, shard.name):
            passed_by = slots[1]._lost_at(shard.name, shard.metadata.resource_version or "")
            seen.append((resource, slots[0].shared.claiming.locked(), passed_by))

    kube.before.append(at_the_claim)
    try:
        assert slots[0]._step() is not None
    finally:
        watches.close()
    assert seen[:2] == [(LEASES, False, True), (SHARDS, False, True)], (
        "at the Lease create and at the claim write: the lock free, the shard passed by"
    )


def test_an_idle_slot_waits_while_a_sibling_runs_and_all_leave_together(tmp_path: Path) -> None:
    """Two slots, one shard of a command that runs until told: the idle slot does not leave while
    its sibling runs (idleSeconds 0), and both leave once the shard is Done."""
    kube = FakeKube()
    release = tmp_path / "release"
    wait_for_release = [
        sys.executable,
        "-c",
        "import json, os, pathlib, time\n"
        f"while not pathlib.Path({str(release)!r}).exists():\n"
        "    time.sleep(0.01)\n"
        "with open(os.environ['SHARDOPS_RESULTS_FILE'], 'a') as out:\n"
        "    for line in open(os.environ['SHARDOPS_ITEMS_FILE']):\n"
        "        out.write(json.dumps({'key': json.loads(line)['key'], 'result': 1}) + '\\n')\n",
    ]
    (shard,) = add_campaign(
        kube, campaign_body(items=[{"id": 0}], worker={"image": "x", "command": wait_for_release})
    )
    slots, watches = _slots(kube, tmp_path, 2)
    ended: list[int] = []
    finished = threading.Event()

    def run() -> None:
        ended.append(run_slots(slots))
        finished.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        # The shard runs; the other slot found nothing and idleSeconds is 0: without its running
        # sibling it would have left at once. The process is still there while the shard runs.
        for _ in range(400):
            body = kube.obj(SHARDS, NAMESPACE, shard.name) or {}
            if (body.get("status") or {}).get("phase") == ShardPhase.RUNNING and slots[0].shared.busy:
                break
            finished.wait(0.01)
        assert slots[0].shared.busy and not finished.is_set()
        assert not finished.wait(0.5), "the process left while a slot was running a shard"
        release.touch()
        assert finished.wait(30), "the slots did not leave once the shard was done"
    finally:
        release.touch()
        for slot in slots:
            slot.stop.set()
        thread.join(30)
        watches.close()
    assert ended == [0]
    assert Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {}).phase is ShardPhase.DONE


def test_once_a_slot_leaves_the_others_follow_and_the_pod_leaves_as_a_whole(tmp_path: Path) -> None:
    """Slot 1 leaves at once (idleSeconds 0, its only shard in a backoff of an hour); slot 0 would
    wait 600 s for work, but a pod whose Job the operator counts at two slots must not run on with
    one: it follows at its next turn."""
    kube = FakeKube()
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], shardSize=1))
    body = kube.obj(SHARDS, NAMESPACE, shard.name) or {}
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    kube.put(SHARDS, NAMESPACE, {**body, "status": {**body["status"], "notBefore": later}})
    slots, watches = _slots(kube, tmp_path, 2, idle_seconds=600)
    slots[1].settings = worker_settings(tmp_path, slots=2, idle_seconds=0)
    ended: list[int] = []
    thread = threading.Thread(target=lambda: ended.append(run_slots(slots)), daemon=True)
    thread.start()
    thread.join(30)
    alive = thread.is_alive()
    for slot in slots:
        slot.stop.set()
    thread.join(30)
    watches.close()
    assert not alive, "slot 0 stayed after slot 1 left"
    assert ended == [0] and slots[0].shared.leaving.is_set()


def test_a_claim_that_fails_after_its_lease_is_tried_again_at_once(tmp_path: Path) -> None:
    """The Lease won, the claim's write fails (API trouble): the Lease is let go and the shard is not
    left marked as taken, so the next looks claim it instead of passing it by for seconds (the
    clock does not move here: a mark would hold for LOST_CLAIM_SECONDS)."""
    kube = FakeKube()
    agent = {"image": "x", "command": [sys.executable, "-m", "shardops_example_agent.agent"]}
    (shard,) = add_campaign(kube, campaign_body(items=[{"id": 0}], shardSize=1, worker=agent))
    slots, watches = _slots(kube, tmp_path, 1)
    failed: list[str] = []

    def once(_kube: FakeKube, verb: str, resource: object, name: str) -> None:
        if resource == SHARDS and name == shard.name and not failed:
            failed.append(name)
            raise ApiError(503, "ServiceUnavailable", "the API server is busy")

    kube.before.append(once)
    try:
        with pytest.raises(ApiError):
            slots[0]._step()
        assert not slots[0]._lost_recently(shard) and not slots[0].shared.busy
        # The next look reads the Lease it let go (no create meeting a 409) and takes the shard.
        assert slots[0]._step() is not None
    finally:
        watches.close()
    assert failed and Shard.parse(kube.obj(SHARDS, NAMESPACE, shard.name) or {}).phase is ShardPhase.DONE


def test_a_fatal_error_of_one_slot_stops_the_others_and_the_process_says_so(tmp_path: Path) -> None:
    kube = FakeKube()
    add_campaign(kube, campaign_body(items=[{"id": 0}]))
    slots, watches = _slots(kube, tmp_path, 3, idle_seconds=600)

    def broken() -> int:
        raise RuntimeError("a bug in slot 2")

    slots[2].run = broken  # type: ignore[method-assign]
    try:
        assert run_slots(slots) == 1
    finally:
        watches.close()
    assert slots[0].stop.is_set(), "the others were asked to stop (they would have waited 600 s)"


def test_slot_identities_are_unique_and_fit_a_lease_holder() -> None:
    settings = WorkerSettings(pod_name="p" * 300, slots=64)
    identities = {settings.identity_of(slot) for slot in range(64)}
    assert len(identities) == 64
    assert all(len(identity) <= IDENTITY_MAX for identity in identities)
    assert settings.identity_of(0) == settings.identity
    assert settings.identity_of(5) == f"{settings.identity}-5"
    with pytest.raises(ValueError, match="slots"):
        WorkerSettings(slots=0)
    with pytest.raises(ValueError, match="slots"):
        WorkerSettings(slots=65)
