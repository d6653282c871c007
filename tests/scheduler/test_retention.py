"""Result retention (scheduler/retention.py): a record at each finish, and a sweep that deletes a
campaign's stored results only once every record of its name expired and no Campaign of that name
exists."""

from __future__ import annotations

import datetime as dt
from typing import Any

from shardops.api.campaign import Campaign
from shardops.api.enums import StoreType
from shardops.api.shard import Shard
from shardops.api.store import ResultStoreStatus
from shardops.k8s.api import CAMPAIGNS, SHARDS
from shardops.scheduler.retention import Retention, group_of
from shardops.store.records import ItemRecord, ResultMeta
from shardops.store.s3 import S3Store
from tests.fakekube import FakeKube
from tests.fakes3 import FakeS3
from tests.schedulerkit import campaign, shard

NS = "research"
FINISHED = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LOCATION = ResultStoreStatus(type=StoreType.S3, endpoint="http://127.0.0.1:1", bucket="results", prefix="p")


def _campaign(uid: str = "uid-1", finished: dt.datetime | None = FINISHED, **spec: Any) -> Campaign:
    body = campaign("survey", **spec)
    body["metadata"].update(namespace=NS, uid=uid)
    status: dict[str, Any] = {"resultStore": LOCATION.to_dict(), "phase": "Succeeded"}
    if finished is not None:
        status["conditions"] = [
            {
                "type": "Complete",
                "status": "True",
                "reason": "AllDone",
                "message": "",
                "lastTransitionTime": finished.isoformat(),
            }
        ]
    body["status"] = status
    return Campaign.parse(body)


class Setup:
    def __init__(self, default_seconds: int | None = 60) -> None:
        self.kube = FakeKube()
        self.s3 = FakeS3()
        self.stores: dict[str, S3Store] = {}
        self.retention = Retention(self.kube, LOCATION, default_seconds, self.store_for)  # type: ignore[arg-type]

    def store_for(self, namespace: str, location: ResultStoreStatus) -> S3Store | None:
        if location.credentials_secret is not None:
            return None  # only the campaign's workers hold those credentials
        return S3Store(location, namespace, client=self.s3)

    def store(self) -> S3Store:
        return S3Store(LOCATION, NS, client=self.s3)

    def results_of(self, key: str, token: int = 1) -> None:
        """What a worker leaves for one key: an attempt object, its committed pointer, item chunks."""
        store = self.store()
        text = '{"items": []}'
        stored, _ = store.store_result(key, text, ResultMeta("survey", "s", "w", 1, token), 0)
        store.commit(key, stored)
        store.save_items(key, "survey", {"k": ItemRecord({"a": 1}, 0.0)}, shard="s", token=token)

    def names(self) -> list[str]:
        return sorted(self.s3.objects)


def _shards(count: int) -> list[Shard]:
    return [Shard.parse(shard("survey", i, "Done")) for i in range(count)]


def test_a_finish_is_recorded_once_with_the_keys_of_the_live_shards() -> None:
    setup = Setup()
    shards = _shards(2)
    name = setup.retention.record(_campaign(), shards)
    assert name == "p/_retention/research/survey/uid-1-1767225600.json"
    record = setup.store().get_record(name)
    assert record is not None
    assert record["keys"] == sorted(s.spec.idempotency_key for s in shards)
    assert (record["retentionSeconds"], record["expiresAt"]) == (60, "2026-01-01T00:01:00+00:00")
    puts = setup.s3.calls.count("put")
    assert setup.retention.record(_campaign(), shards) == name and setup.s3.calls.count("put") == puts


def test_nothing_is_recorded_while_running_without_a_retention_or_without_the_credentials() -> None:
    assert Setup().retention.record(_campaign(finished=None), _shards(1)) is None
    assert Setup(default_seconds=None).retention.record(_campaign(), _shards(1)) is None
    own = _campaign()
    own.current_status.result_store = LOCATION.model_copy(update={"credentials_secret": "team-s3"})
    assert Setup().retention.record(own, _shards(1)) is None
    # The campaign's own setting wins over the installation's, both ways.
    setup = Setup(default_seconds=None)
    name = setup.retention.record(_campaign(resultStore={"retentionSeconds": 5}), _shards(1))
    assert name is not None and (setup.store().get_record(name) or {})["retentionSeconds"] == 5
    assert Setup(default_seconds=60).retention.record(_campaign(finished=None), _shards(1)) is None


def test_the_sweep_deletes_every_object_of_an_expired_campaign_that_is_gone() -> None:
    setup = Setup()
    shards = _shards(2)
    for s in shards:
        setup.results_of(s.spec.idempotency_key)
    folded_key = "sha256:" + "f" * 64
    setup.results_of(folded_key)
    store = setup.store()
    store.write_ledger("survey", "uid-1", 0, [{"index": 5, "idempotencyKey": folded_key}])
    store.put_record(f"{store.input_prefix('survey')}abc.jsonl", {"n": 1})
    other = "sha256:" + "e" * 64
    setup.results_of(other)  # another campaign's: stays
    setup.retention.record(_campaign(), shards)
    before = len(setup.names())

    assert setup.retention.sweep(FINISHED + dt.timedelta(seconds=59)) == 0, "not expired yet"
    assert len(setup.names()) == before
    deleted = setup.retention.sweep(FINISHED + dt.timedelta(seconds=60))
    left = setup.names()
    assert deleted == 3 * 3 + 1 + 1, left  # three keys (attempt, pointer, chunk), ledger, input
    assert all(other.removeprefix("sha256:")[:20] in name for name in left), left
    assert len(left) == 3


def test_a_campaign_of_that_name_keeps_everything_and_a_newer_finish_waits_for_its_own() -> None:
    setup = Setup()
    shards = _shards(1)
    setup.results_of(shards[0].spec.idempotency_key)
    setup.retention.record(_campaign(), shards)
    setup.kube.put(CAMPAIGNS, NS, {**campaign("survey"), "metadata": {"name": "survey", "uid": "uid-2"}})
    later = FINISHED + dt.timedelta(days=1)
    assert setup.retention.sweep(later) == 0, "a Campaign of that name exists (re-applied)"
    setup.kube.delete(CAMPAIGNS, NS, "survey")
    # The re-applied one finished an hour after the first: its record is not expired yet.
    setup.retention.record(_campaign(uid="uid-2", finished=later - dt.timedelta(seconds=30)), shards)
    assert setup.retention.sweep(later) == 0
    assert setup.retention.sweep(later + dt.timedelta(seconds=30)) == 3
    assert setup.names() == []


def test_record_names_group_by_namespace_and_campaign() -> None:
    assert group_of("p/_retention/ns/camp/uid-1.json", "p/_retention/") == ("ns", "camp")
    assert group_of("p/_retention/ns/camp/deeper/uid-1.json", "p/_retention/") is None
    assert group_of("q/_retention/ns/camp/uid-1.json", "p/_retention/") is None


def _expired_with_results(setup: Setup, count: int) -> list[str]:
    """`count` keys of results, recorded by an expired finish of a campaign that is gone."""
    shards = _shards(count)
    for s in shards:
        setup.results_of(s.spec.idempotency_key)
    setup.retention.record(_campaign(), shards)
    return [s.spec.idempotency_key for s in shards]


def test_a_replica_that_stops_leading_deletes_nothing_more() -> None:
    setup = Setup()
    _expired_with_results(setup, 3)
    before = setup.names()
    setup.retention.is_leader = lambda: False
    assert setup.retention.sweep(FINISHED + dt.timedelta(days=1)) == 0
    assert setup.names() == before, "a standby (or a deposed leader) never deletes"

    answers = iter([True, True, False])  # leads for the mark and the first key, then loses the Lease
    setup.retention.is_leader = lambda: next(answers, False)
    setup.retention.sweep(FINISHED + dt.timedelta(days=1))
    left = setup.names()
    assert len(before) - len(left) == 3, "one key's objects went, then the sweep stopped"
    assert sum("_retention/" in name for name in left) == 1, "the record stays for the next leader"


def test_a_campaign_reapplied_during_the_sweep_waits_and_never_reuses_what_goes() -> None:
    setup = Setup()
    keys = _expired_with_results(setup, 2)
    seen_during: list[bool] = []
    original_get = setup.kube.get

    def get(resource: Any, namespace: str, name: str) -> Any:
        # The moment after the sweep's check: a user re-applies the campaign.
        answer = None
        try:
            answer = original_get(resource, namespace, name)
        finally:
            if resource == CAMPAIGNS and not seen_during:
                setup.kube.put(CAMPAIGNS, NS, campaign("survey"))
                seen_during.append(setup.retention.sweeping(NS, "survey"))
        return answer

    setup.kube.get = get  # type: ignore[method-assign]
    assert setup.retention.sweep(FINISHED + dt.timedelta(days=1)) > 0
    assert seen_during == [True], "a pass over the new campaign would have waited for the sweep"
    assert not setup.retention.sweeping(NS, "survey"), "and runs once the sweep is done"
    store = setup.store()
    assert all(store.read_result(key) is None for key in keys), "nothing left to reuse half deleted"


def test_a_key_loses_its_pointer_before_its_result_objects() -> None:
    setup = Setup()
    key = _expired_with_results(setup, 1)[0]
    store = setup.store()
    order: list[str] = []
    delete = setup.s3.delete_objects

    def recording(Bucket: str, Delete: dict[str, Any]) -> Any:
        order.extend(entry["Key"] for entry in Delete["Objects"])
        return delete(Bucket=Bucket, Delete=Delete)

    setup.s3.delete_objects = recording  # type: ignore[method-assign]
    store.delete_key(key)
    assert order[0] == store.pointer_name(key), order


def test_a_pass_over_a_campaign_whose_name_is_being_swept_cuts_nothing() -> None:
    from tests.schedulerkit import NAMESPACE, Clock, OperatorKube, put_campaign, reconciler

    kube, clock = OperatorKube(), Clock()
    put_campaign(kube, campaign("camp"))
    operator = reconciler(kube, clock)
    operator.retention._sweeping.add((NAMESPACE, "camp"))
    operator.reconcile(NAMESPACE, "camp")
    assert kube.list(SHARDS, NAMESPACE) == [], "waits while the results of its name go"
    operator.retention._sweeping.clear()
    operator.reconcile(NAMESPACE, "camp")
    assert kube.list(SHARDS, NAMESPACE), "then runs"
