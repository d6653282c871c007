"""The worker loop against an in-memory API server, with real commands (the example agent).

Each test sets up the moment another party acts (a takeover, a conflicting write, SIGTERM) with a
hook at an exact point of the protocol, then checks what the worker wrote and what it did not.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from shardops.api.campaign import Campaign
from shardops.api.shard import Shard
from shardops.k8s import leases
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, EVENTS, LEASES, SHARDS, ApiError, Resource
from shardops.logic.idempotency import item_subkey
from shardops.logic.leases import Renewals
from shardops.store.configmap import (
    PREFIXES,
    attempt_name,
    check_result,
    commit,
    items_name,
    save_items,
    store_result,
)
from shardops.store.records import ItemRecord, ResultMeta, encode_result
from shardops.worker import runtime
from shardops.worker.claim import lease_owner_reference
from tests import workerkit
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE, T0, ShiftedClock, add_campaign, campaign_body, watching_worker, worker

AGENT = [sys.executable, "-m", "shardops_example_agent.agent"]


def _agent_campaign(items: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    env = [{"name": k, "value": v} for k, v in spec.pop("env", {}).items()]
    return campaign_body(items=items, worker={"image": "x", "command": AGENT, "env": env}, **spec)


def _shard(kube: FakeKube, name: str) -> Shard:
    found = kube.obj(SHARDS, NAMESPACE, name)
    assert found is not None
    return Shard.parse(found)


def _reasons(shard: Shard) -> list[tuple[str, int]]:
    return [(h.reason, h.attempt) for h in shard.current_status.history]


def _holder(kube: FakeKube, name: str) -> str | None:
    found = kube.obj(LEASES, NAMESPACE, name)
    return None if found is None else found["spec"].get("holderIdentity")


def test_runs_every_shard_to_done_stores_verified_results_and_exits(tmp_path: Path) -> None:
    kube = FakeKube()
    shards = add_campaign(kube, _agent_campaign([{"id": i} for i in range(4)]))
    worker = workerkit.worker(kube, tmp_path)
    assert worker.run() == 0
    for shard in shards:
        done = _shard(kube, shard.name)
        status = done.current_status
        assert status.phase == "Done" and _reasons(done) == [
            ("Materialized", 1),
            ("Claimed", 1),
            ("Completed", 1),
        ]
        assert status.owner is None and status.lease_until is None and status.fencing_token is None
        assert status.progress is not None and (status.progress.done, status.progress.total) == (2, 2)
        assert status.cost == Decimal("0.02")  # two items at 0.01, exactly
        assert status.result is not None and status.result.ref == attempt_name(shard.spec.idempotency_key, 1)
        configmap = kube.obj(CONFIGMAPS, NAMESPACE, status.result.ref)
        assert configmap is not None
        stored = check_result(configmap, shard.spec.idempotency_key)
        assert stored.fingerprint == status.result.fingerprint and stored.bytes == status.result.bytes
        document = json.loads(stored.text)
        assert [e["key"] for e in document["items"]] == [item_subkey(i) for i in shard.spec.items or []]
        # Done is terminal: the Lease is left to run out (and goes with its Shard), not released.
        assert _holder(kube, shard.name) is not None
        # A shard that went well needs no person: its transitions are in the history, not Events.
        assert [e.reason for e in status.history] == ["Materialized", "Claimed", "Completed"]
        assert all(e.event is None for e in status.history)
        assert [e for e in kube.list(EVENTS, NAMESPACE) if e["regarding"]["name"] == shard.name] == []
    assert list(tmp_path.iterdir()) == [], "per-attempt directories are removed"


def test_a_stored_result_is_reused_and_the_command_never_runs(tmp_path: Path) -> None:
    kube = FakeKube()
    marker = tmp_path / "ran"
    body = campaign_body(items=[{"id": 1}], worker={"image": "x", "command": ["touch", str(marker)]})
    (shard,) = add_campaign(kube, body)
    key = shard.spec.idempotency_key
    text = encode_result(key, [(0, item_subkey({"id": 1}), "stored earlier")])
    previous, _ = store_result(
        kube, NAMESPACE, key, text, ResultMeta("camp", shard.name, "old", 1), 1, 10_000
    )  # type: ignore[arg-type]
    commit(kube, NAMESPACE, key, previous)  # type: ignore[arg-type]
    assert workerkit.worker(kube, tmp_path).run() == 0
    done = _shard(kube, shard.name).current_status
    assert done.phase == "Done" and done.result is not None
    assert (done.result.ref, done.result.fingerprint) == (previous.name, previous.fingerprint)
    assert not marker.exists()


def test_stored_item_results_are_skipped_on_resume(tmp_path: Path) -> None:
    kube = FakeKube()
    ledger = tmp_path / "ledger.jsonl"
    items = [{"id": i} for i in range(4)]
    (shard,) = add_campaign(
        kube, _agent_campaign(items, shardSize=4, env={"SHARDOPS_AGENT_LEDGER": str(ledger)})
    )
    earlier = {item_subkey(items[i]): ItemRecord({"from": "earlier"}, 0.01) for i in (0, 2)}
    save_items(kube, NAMESPACE, shard.spec.idempotency_key, "camp", earlier, 10_000)  # type: ignore[arg-type]
    assert workerkit.worker(kube, tmp_path / "w").run() == 0
    ran = [json.loads(line)["index"] for line in ledger.read_text().splitlines() if '"done"' in line]
    assert ran == [1, 3], "only the items without a stored result run"
    done = _shard(kube, shard.name)
    assert done.current_status.history[1].reason == "Claimed"
    result = done.current_status.result
    assert result is not None
    configmap = kube.obj(CONFIGMAPS, NAMESPACE, result.ref)
    assert configmap is not None
    results = [e["result"] for e in json.loads(configmap["data"]["result.json"])["items"]]
    assert results[0] == results[2] == {"from": "earlier"} and results[1]["attempt"] == 1


def test_retryable_failure_backs_off_charges_an_attempt_and_records_the_error(tmp_path: Path) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1, "fault": "rate-limited"}], shardSize=1))
    assert workerkit.worker(kube, tmp_path, max_shards=1).run() == 0
    status = _shard(kube, shard.name).current_status
    assert status.phase == "Pending" and status.attempt == 2
    assert _reasons(_shard(kube, shard.name))[-1] == ("AttemptFailed", 1)
    assert status.last_error is not None and status.last_error.error_class == "rate-limited"
    assert status.last_error.event == status.history[-1].event
    assert status.not_before is not None
    # backoff base 2s, attempt 1: between 1 and 2 seconds from the failure, as recorded in the history
    # (measured from the failure itself, not from the test's start: a slow machine cannot stretch it).
    delay = (status.not_before - status.history[-1].at).total_seconds()
    assert 1.0 <= delay <= 2.0, delay
    assert _holder(kube, shard.name) is None


def test_exit_zero_with_items_missing_is_bad_output(tmp_path: Path) -> None:
    kube = FakeKube()
    body = campaign_body(items=[{"id": 1}], worker={"image": "x", "command": ["true"]})
    (shard,) = add_campaign(kube, body)
    assert workerkit.worker(kube, tmp_path).run() == 0
    status = _shard(kube, shard.name).current_status
    assert status.phase == "Failed" and status.last_error is not None
    assert status.last_error.error_class == "bad-output"
    assert "exited 0 but wrote results for 0 of 1 item(s)" in status.last_error.message


def test_a_result_over_the_cap_fails_and_stores_nothing(tmp_path: Path) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1, "fault": "big", "bytes": 5000}], shardSize=1))
    assert workerkit.worker(kube, tmp_path, result_max_bytes=2000).run() == 0
    status = _shard(kube, shard.name).current_status
    assert status.phase == "Failed" and status.last_error is not None
    assert status.last_error.error_class == "result-too-large"
    stored = [c["metadata"]["name"] for c in kube.list(CONFIGMAPS, NAMESPACE)]
    assert [name for name in stored if name.startswith(PREFIXES)] == [], "no result, attempt or items"


def test_a_lost_lease_stops_the_command_and_nothing_more_is_written(tmp_path: Path) -> None:
    kube = FakeKube()
    ledger = tmp_path / "ledger.jsonl"
    items = [{"id": i, "latency": 0.4} for i in range(6)]
    (shard,) = add_campaign(
        kube, _agent_campaign(items, shardSize=6, env={"SHARDOPS_AGENT_LEDGER": str(ledger)})
    )
    kube.calls.clear()
    stolen = []

    def thief(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        # At the first renewal: the lease expired meanwhile and another worker took it over.
        if resource is LEASES and verb == "patch" and not stolen:
            lease = fake.obj(LEASES, NAMESPACE, name)
            assert lease is not None and lease["spec"]["holderIdentity"] != "thief"
            spec = {
                **lease["spec"],
                "holderIdentity": "thief",
                "leaseTransitions": lease["spec"]["leaseTransitions"] + 1,
            }
            fake.put(LEASES, NAMESPACE, {**lease, "spec": spec})
            stolen.append(time.monotonic())

    kube.before.append(thief)
    started = time.monotonic()
    assert workerkit.worker(kube, tmp_path / "w", max_shards=1).run() == 0
    assert stolen, "the worker never renewed its lease"
    # Fenced at the first heartbeat (1 s), well before the command's 6 items of 0.4 s.
    assert time.monotonic() - started < 2.3
    done_items = [line for line in ledger.read_text().splitlines() if '"done"' in line]
    assert len(done_items) < len(items), "the command was not stopped"
    # After the claim: one refused renewal, no shard write, no result, the thief still holds it.
    shard_writes = [w for w in kube.write_log() if w[1] == "shards"]
    assert shard_writes == [("patch", "shards", shard.name, 200)], shard_writes
    assert kube.writes_to("leases", ok=False) == [("patch", "leases", shard.name, 409)]
    assert [w for w in kube.write_log() if w[1] == "configmaps"] == []
    assert _holder(kube, shard.name) == "thief"
    status = _shard(kube, shard.name).current_status
    assert status.phase == "Running" and status.owner != "thief", "the worker wrote nothing after losing it"


@pytest.mark.parametrize(
    ("races", "transitions"),
    [
        pytest.param(1, 1, id="listing behind: one read, then the claim holds"),
        pytest.param(2, 2, id="written under it twice: the Lease goes back, taken again later"),
    ],
)
def test_a_conflicting_claim_reads_the_shard_once_then_gives_the_lease_back(
    tmp_path: Path, races: int, transitions: int
) -> None:
    kube = FakeKube()
    shards = add_campaign(kube, _agent_campaign([{"id": i} for i in range(2)], shardSize=1))
    raced: list[str] = []

    def operator_writes_first(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        if resource is SHARDS and verb == "patch" and len(raced) < races:
            current = fake.obj(SHARDS, NAMESPACE, name)
            assert current is not None
            fake.put(SHARDS, NAMESPACE, current)  # a new resourceVersion, as any other write makes
            raced.append(name)

    kube.before.append(operator_writes_first)
    # Idle time lets the worker come back for the shard it lost; it exits once both are Done.
    assert workerkit.worker(kube, tmp_path, claim_candidates=1, idle_seconds=10).run() == 0
    assert len(raced) == races and len(set(raced)) == 1
    for shard in shards:
        assert _shard(kube, shard.name).phase == "Done"
    lease = kube.obj(LEASES, NAMESPACE, raced[0])
    assert lease is not None and lease["spec"]["leaseTransitions"] == transitions


def _zombie(kube: FakeKube, shard: Shard, attempt: int) -> None:
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=60)
    leases.acquire(kube, NAMESPACE, shard.name, "dead-worker", 10, past, seen=Renewals(time.monotonic))  # type: ignore[arg-type]
    current = _shard(kube, shard.name)
    status = {**(kube.obj(SHARDS, NAMESPACE, shard.name) or {})["status"]}
    status.update(
        phase="Running",
        owner="dead-worker",
        attempt=attempt,
        leaseUntil=(past + dt.timedelta(seconds=10)).isoformat(),
        fencingToken=1,
    )
    kube.put(SHARDS, NAMESPACE, {**current.to_dict(), "status": status})


def test_a_zombie_is_reclaimed_with_attempt_plus_one_then_claimed(tmp_path: Path) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1))
    _zombie(kube, shard, attempt=1)
    assert watching_worker(kube, tmp_path, 10).run() == 0
    done = _shard(kube, shard.name)
    assert _reasons(done)[-3:] == [("LeaseExpired", 1), ("Claimed", 2), ("Completed", 2)]
    assert done.current_status.history[-3].owner == "dead-worker"
    error = done.current_status.last_error
    assert error is not None and error.error_class == "unknown" and error.message.startswith("worker lost:")
    lease = kube.obj(LEASES, NAMESPACE, shard.name)
    assert lease is not None and lease["spec"]["leaseTransitions"] == 2


def _on_its_last_attempt(command: list[str]) -> dict[str, object]:
    """A one-item campaign of maxAttempts 2, for a zombie on attempt 2."""
    return campaign_body(
        items=[{"id": 1}], shardSize=1, maxAttempts=2, worker={"image": "x", "command": command}
    )


def test_a_zombie_on_its_last_attempt_is_blocked_not_run(tmp_path: Path) -> None:
    kube = FakeKube()
    marker = tmp_path / "ran"
    body = _on_its_last_attempt(["touch", str(marker)])
    (shard,) = add_campaign(kube, body)
    _zombie(kube, shard, attempt=2)
    assert watching_worker(kube, tmp_path, 10).run() == 0
    blocked = _shard(kube, shard.name).current_status
    assert blocked.phase == "Blocked" and blocked.last_error is not None
    assert blocked.last_error.error_class == "unknown" and "attempt 2 of 2" in blocked.last_error.message
    assert blocked.last_error.message.startswith("worker lost: lease of dead-worker expired")
    assert not marker.exists() and _holder(kube, shard.name) is None


def test_sigterm_releases_the_shard_with_its_partial_results_and_no_attempt_charged(tmp_path: Path) -> None:
    kube = FakeKube()
    items = [{"id": 0, "latency": 0}, {"id": 1, "latency": 30}]
    (shard,) = add_campaign(kube, _agent_campaign(items, shardSize=2))
    worker = workerkit.worker(kube, tmp_path, term_grace_seconds=5)

    workerkit.stop_after_first_result(worker, tmp_path)
    started = time.monotonic()
    assert worker.run() == 0
    assert time.monotonic() - started < 10, "the command was not stopped promptly"
    released = _shard(kube, shard.name)
    status = released.current_status
    assert status.phase == "Pending" and status.attempt == 1 and status.owner is None
    assert _reasons(released)[-1] == ("Released", 1)
    assert status.progress is not None and status.progress.done == 1
    items_map = kube.obj(CONFIGMAPS, NAMESPACE, items_name(shard.spec.idempotency_key))
    assert items_map is not None and len(items_map["data"]) == 1, "the finished item was flushed"
    assert _holder(kube, shard.name) is None


def test_worker_exits_when_the_campaign_is_missing_suspended_or_out_of_budget(tmp_path: Path) -> None:
    assert workerkit.worker(FakeKube(), tmp_path).run() == 0
    for spec in ({"suspend": True}, {"budget": {"limit": 1}}):
        kube = FakeKube()
        body = _agent_campaign([{"id": 1}], **spec)
        if "budget" in spec:
            body["status"] = {"spent": 5}
        add_campaign(kube, body)
        kube.calls.clear()
        assert workerkit.worker(kube, tmp_path).run() == 0
        assert [w for w in kube.write_log() if w[1] in ("shards", "leases")] == []


def test_a_deleted_campaigns_shards_are_never_claimed_by_the_new_one(tmp_path: Path) -> None:
    """A Campaign deleted and applied again under its name: its old Shards (controller: the old uid)
    are left to the garbage collector, not run for the new one."""
    kube = FakeKube()
    shards = add_campaign(kube, _agent_campaign([{"id": i} for i in range(4)]))
    old = {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "name": "camp",
        "uid": "uid-old",
        "controller": True,
    }
    for shard in shards:
        stored = kube.obj(SHARDS, NAMESPACE, shard.name)
        assert stored is not None
        stored["metadata"]["ownerReferences"] = [old]
    kube.calls.clear()
    assert workerkit.worker(kube, tmp_path).run() == 0
    assert [w for w in kube.write_log() if w[1] in ("shards", "leases")] == []


def test_a_lease_left_held_by_the_deleted_campaigns_done_shard_does_not_strand_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleted and applied again before the garbage collector removed the old Done shard's Lease
    (left held, owned by the old Shard's uid): the first claim's create meets it and loses. The worker
    does not go idle on a shard it only passed by as lost; once the window has passed it reads the
    Lease, takes it over as one held for an earlier Shard, and runs the shard (as the e2e
    test_worker_idempotency re-apply saw: every worker gone after its idle 3 s, shards left Pending)."""
    monkeypatch.setattr(runtime, "LOST_CLAIM_SECONDS", 0.2)
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}]))
    earlier = {**lease_owner_reference(shard), "uid": "uid-of-the-deleted-shard"}
    left = leases.acquire(
        kube, NAMESPACE, shard.lease_name, "done-worker", 10, T0, earlier, seen=Renewals(time.monotonic)
    )  # type: ignore[arg-type]
    assert left is not None
    stop = threading.Event()
    worker = workerkit.worker(kube, tmp_path, stop=stop)
    running = threading.Thread(target=worker.run)
    running.start()
    # Bounded well inside the Lease's 10 s: without the takeover the claimer waits for those to pass.
    running.join(timeout=8)
    stop.set()
    running.join()
    assert _shard(kube, shard.name).phase == "Done"
    lease = kube.obj(LEASES, NAMESPACE, shard.lease_name)
    assert lease is not None and lease["spec"]["leaseTransitions"] == 2


def test_a_worker_of_a_deleted_campaign_leaves_the_new_one_alone(tmp_path: Path) -> None:
    kube = FakeKube()
    add_campaign(kube, _agent_campaign([{"id": 1}]))
    kube.calls.clear()
    assert workerkit.worker(kube, tmp_path, campaign_uid="uid-deleted").run() == 0
    assert [w for w in kube.write_log() if w[1] in ("shards", "leases")] == []
    assert workerkit.worker(kube, tmp_path, campaign_uid="uid-camp").run() == 0
    assert kube.writes_to("shards"), "its own campaign's worker claims"


def test_local_trouble_preparing_the_attempt_is_a_retryable_failure(tmp_path: Path) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1))
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    assert workerkit.worker(kube, tmp_path, work_dir=not_a_directory, max_shards=1).run() == 0
    status = _shard(kube, shard.name).current_status
    assert status.phase == "Pending" and status.attempt == 2 and status.last_error is not None
    assert (
        status.last_error.error_class == "unknown"
        and "cannot write the attempt's files" in status.last_error.message
    )


def test_an_api_failure_while_storing_the_result_is_retried_not_charged(tmp_path: Path) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1))
    broken: list[str] = []

    def store_down_once(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        if resource is CONFIGMAPS and not broken:
            broken.append(name)
            raise ApiError(503, "ServiceUnavailable", "etcd is having a bad day")

    kube.before.append(store_down_once)
    assert workerkit.worker(kube, tmp_path, max_shards=1).run() == 0
    assert broken
    done = _shard(kube, shard.name)
    assert done.phase == "Done" and _reasons(done)[-2:] == [("Claimed", 1), ("Completed", 1)]


def test_when_nothing_can_be_written_the_shard_is_left_to_its_lease(tmp_path: Path) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1))
    clock = ShiftedClock()

    def api_down(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        # From the first result write on, every write fails, and meanwhile the lease runs out.
        if resource is CONFIGMAPS or (resource is SHARDS and kube.writes_to("configmaps", ok=False)):
            clock.offset = 300.0
            raise ApiError(503, "ServiceUnavailable", "down")

    kube.before.append(api_down)
    kube.calls.clear()
    runner = worker(kube, tmp_path, max_shards=1, clock=clock)
    assert runner.run() == 0
    stuck = _shard(kube, shard.name).current_status
    assert stuck.phase == "Running" and stuck.owner is not None
    assert ("create", "configmaps", _items_name(shard), 503) in kube.write_log()
    assert kube.writes_to("shards", ok=False) == [], "no attempt is charged for API trouble"
    assert runner.metrics.sample("shardops_worker_fenced_total", reason="expired") == 1
    assert _holder(kube, shard.name) == stuck.owner, "the claim stays until its lease runs out"


def _items_name(shard: Shard) -> str:
    return items_name(shard.spec.idempotency_key)


def test_add_campaign_materializes_pending_shards_and_records_them_cut() -> None:
    kube = FakeKube()
    shards = add_campaign(kube, campaign_body(items=[{"id": i} for i in range(5)]))
    assert [s.name for s in shards] == ["camp-00000", "camp-00001", "camp-00002"]
    assert {s.phase for s in shards} == {"Pending"} and {s.current_status.attempt for s in shards} == {1}
    recorded = Campaign.parse(kube.obj(CAMPAIGNS, NAMESPACE, "camp") or {})
    assert recorded.current_status.cut_shards == 3


def test_with_the_s3_store_a_shard_costs_three_worker_writes_and_no_configmap(tmp_path: Path) -> None:
    from shardops.api.enums import StoreType
    from shardops.api.store import ResultStoreStatus
    from shardops.store.s3 import S3Store
    from tests.fakes3 import FakeS3

    kube = FakeKube()
    body = _agent_campaign([{"id": 1}], env={"SHARDOPS_AGENT_LATENCY": "0"})
    location = ResultStoreStatus(type=StoreType.S3, endpoint="http://127.0.0.1:1", bucket="results")
    body["status"] = {"resultStore": location.to_dict()}
    (shard,) = add_campaign(kube, body)
    worker = workerkit.worker(kube, tmp_path)
    s3 = FakeS3()
    worker.shared.store(location.model_dump_json(), lambda: S3Store(location, NAMESPACE, client=s3))
    before = len(kube.write_log())
    assert worker.run() == 0
    done = _shard(kube, shard.name)
    assert done.phase == "Done" and done.current_status.result is not None
    assert (
        done.current_status.result.ref.endswith("/t1.json") and "/attempts/" in done.current_status.result.ref
    )
    # Lease create, claim, Done: no renewal on the way to Done (the lease is fresh), no release (Done
    # is terminal) and no ConfigMap write.
    verbs = [(e[0], e[1]) for e in kube.write_log()[before:] if 200 <= e[3] < 300]
    assert verbs == [("create", "leases"), ("patch", "shards"), ("patch", "shards")], verbs
    kinds = sorted(k.split("/")[2] for k in s3.objects)
    assert kinds == ["attempts", "results"], s3.objects.keys()


def test_the_finalize_shard_reads_every_finished_item_in_item_order(tmp_path: Path) -> None:
    from shardops.k8s.shards import TransitionRequest, apply_transition
    from shardops.logic.transitions import Action
    from shardops.scheduler import builders
    from tests.workerkit import OPERATOR, T0

    copy = tmp_path / "seen.jsonl"
    script = f'import os, shutil; shutil.copy(os.environ["SHARDOPS_CAMPAIGN_RESULTS_FILE"], {str(copy)!r})'
    items = [{"id": i} for i in range(5)]
    body = _agent_campaign(
        items,
        env={"SHARDOPS_AGENT_LATENCY": "0"},
        finalize={"image": "x", "command": [sys.executable, "-c", script]},
    )
    work = add_campaign(kube := FakeKube(), body)
    work_dir = tmp_path / "work"
    assert workerkit.worker(kube, work_dir).run() == 0
    campaign = Campaign.parse(kube.obj(CAMPAIGNS, NAMESPACE, "camp") or {})
    created = kube.put(SHARDS, NAMESPACE, builders.finalize_shard_body(campaign, campaign.spec.items or []))
    apply_transition(kube, Shard.parse(created), TransitionRequest(Action.MATERIALIZE, "test"), OPERATOR, T0)  # type: ignore[arg-type]
    assert workerkit.worker(kube, work_dir).run() == 0
    assert _shard(kube, "camp-finalize").phase == "Done"
    lines = [json.loads(line) for line in copy.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(5))
    assert [line["item"] for line in lines] == items
    assert [line["key"] for line in lines] == [item_subkey(i) for i in items]
    assert {line["shard"] for line in lines} == {s.name for s in work}
    assert all(line["result"] is not None and line["attempt"] == 1 for line in lines)


def test_the_finalize_shard_fails_invalid_input_when_the_itemsfrom_input_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from shardops.k8s.shards import TransitionRequest, apply_transition
    from shardops.logic.transitions import Action
    from shardops.scheduler import builders
    from shardops.state import results
    from tests.workerkit import OPERATOR, T0

    items = [{"id": i} for i in range(4)]
    text = "".join(json.dumps(item) + "\n" for item in items)
    body = _agent_campaign(
        items,
        env={"SHARDOPS_AGENT_LATENCY": "0"},
        finalize={"image": "x", "command": [sys.executable, "-c", ""]},
    )
    add_campaign(kube := FakeKube(), body)
    work_dir = tmp_path / "work"
    assert workerkit.worker(kube, work_dir).run() == 0
    # The campaign's items came from a ConfigMap, pinned at the operator's first read; then edited.
    stored = kube.obj(CAMPAIGNS, NAMESPACE, "camp") or {}
    del stored["spec"]["items"]
    stored["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    pin = {
        "source": "ConfigMap questions key items.jsonl",
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    stored["status"]["itemsPin"] = pin
    kube.put(CAMPAIGNS, NAMESPACE, stored)
    edited = text.replace('"id": 2', '"id": 20')
    kube.put(CONFIGMAPS, NAMESPACE, {"metadata": {"name": "questions"}, "data": {"items.jsonl": edited}})
    campaign = Campaign.parse(kube.obj(CAMPAIGNS, NAMESPACE, "camp") or {})
    created = kube.put(SHARDS, NAMESPACE, builders.finalize_shard_body(campaign, items))
    apply_transition(kube, Shard.parse(created), TransitionRequest(Action.MATERIALIZE, "test"), OPERATOR, T0)  # type: ignore[arg-type]
    done_lines = results.done_lines

    def folded(read: Any, finished: Any, every_item: Any) -> Any:
        every_item()[0:1]  # as when the work shards were folded: their items come from the input
        return done_lines(read, finished, every_item)

    monkeypatch.setattr(results, "done_lines", folded)
    workerkit.worker(kube, work_dir).run()
    final = _shard(kube, "camp-finalize")
    error = final.current_status.last_error
    assert final.phase == "Failed" and error is not None, final.current_status
    assert error.error_class == "invalid-input", error
    assert "ConfigMap questions key items.jsonl (spec.itemsFrom) changed after" in error.message
