"""Writes of the claim protocol whose answer was lost: applied, then answered with a 504, a read
timeout, or the 409 that the client's retry meets when it runs into the write itself.

Each test loses the answer to one write of the worker (`FakeKube.lose_answers`) and checks that the
worker re-read and recognised its own write: it goes on as the holder it is, charges no attempt for a
run that never failed, and leaves no Lease held by nobody's run.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from shardops.k8s import leases
from shardops.k8s.api import LEASES
from shardops.logic.leases import Renewals
from tests import workerkit
from tests.fakekube import LOST_ANSWERS, Call, FakeKube, LostAnswer
from tests.worker.test_runtime import _agent_campaign, _holder, _reasons, _shard
from tests.workerkit import NAMESPACE, add_campaign

ANSWERS = [pytest.param(answer, id=name) for name, answer in LOST_ANSWERS.items()]
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _status_write(phase: str) -> object:
    def match(call: Call) -> bool:
        body = call.body if isinstance(call.body, dict) else {}
        return call.plural == "shards" and (body.get("status") or {}).get("phase") == phase

    return match


def _shards_done(worker_metrics: object, outcome: str) -> float:
    labels = {"shard_class": "work", "outcome": outcome, "error_class": ""}
    return worker_metrics.sample("shardops_worker_shards_total", **labels)  # type: ignore[attr-defined]


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_claim_whose_answer_was_lost_is_recognised_and_run_on_the_same_attempt(
    tmp_path: Path, answer: LostAnswer
) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1))
    lost = kube.lose_answers(_status_write("Running"), answer)  # type: ignore[arg-type]
    worker = workerkit.worker(kube, tmp_path, max_shards=1)
    assert worker.run() == 0
    assert len(lost) == 1
    done = _shard(kube, shard.name)
    assert done.phase == "Done"
    assert _reasons(done) == [("Materialized", 1), ("Claimed", 1), ("Completed", 1)]
    lease = kube.obj(LEASES, NAMESPACE, shard.name)
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1, "claimed once, never given back"


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_lease_create_whose_answer_was_lost_is_recognised_as_our_claim(
    tmp_path: Path, answer: LostAnswer
) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1))
    lost = kube.lose_answers(lambda call: call.plural == "leases" and call.verb == "create", answer)
    assert workerkit.worker(kube, tmp_path, max_shards=1).run() == 0
    assert len(lost) == 1
    done = _shard(kube, shard.name)
    assert done.phase == "Done" and _reasons(done)[-2:] == [("Claimed", 1), ("Completed", 1)]
    assert done.current_status.history[-2].owner == _holder(kube, shard.name)


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_done_write_whose_answer_was_lost_completes_the_shard_not_fences_it(
    tmp_path: Path, answer: LostAnswer
) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1))
    lost = kube.lose_answers(_status_write("Done"), answer)  # type: ignore[arg-type]
    worker = workerkit.worker(kube, tmp_path, max_shards=1)
    assert worker.run() == 0
    assert len(lost) == 1
    done = _shard(kube, shard.name)
    assert done.phase == "Done" and _reasons(done)[-1] == ("Completed", 1)
    assert _shards_done(worker.metrics, "done") == 1
    assert worker.metrics.sample("shardops_worker_fenced_total", reason="shard") == 0


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_failure_write_whose_answer_was_lost_still_releases_the_lease(
    tmp_path: Path, answer: LostAnswer
) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1, "fault": "rate-limited"}], shardSize=1))
    lost = kube.lose_answers(_status_write("Pending"), answer)  # type: ignore[arg-type]
    worker = workerkit.worker(kube, tmp_path, max_shards=1)
    assert worker.run() == 0
    assert len(lost) == 1
    failed = _shard(kube, shard.name)
    assert failed.phase == "Pending" and _reasons(failed)[-1] == ("AttemptFailed", 1)
    assert _holder(kube, shard.name) is None, "the Lease is given back, so the retry can start at once"
    assert worker.metrics.sample("shardops_worker_fenced_total", reason="shard") == 0


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_lease_release_whose_answer_was_lost_is_recognised(answer: LostAnswer) -> None:
    kube = FakeKube()
    claim = leases.acquire(kube, NAMESPACE, "s", "w1", 10, NOW, seen=Renewals(lambda: 0.0))  # type: ignore[arg-type]
    assert claim is not None
    kube.lose_answers(lambda call: call.plural == "leases" and call.verb == "patch", answer)
    assert leases.release(kube, claim)  # type: ignore[arg-type]
    assert _holder(kube, "s") is None


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_lease_takeover_whose_answer_was_lost_is_recognised(answer: LostAnswer) -> None:
    kube = FakeKube()
    monotonic = [0.0]
    seen = Renewals(lambda: monotonic[0])
    old = leases.acquire(kube, NAMESPACE, "s", "dead", 10, NOW - dt.timedelta(minutes=1), seen=seen)  # type: ignore[arg-type]
    assert old is not None
    assert not leases.is_free(kube.obj(LEASES, NAMESPACE, "s"), seen)  # w1 sees it held, then silent
    monotonic[0] = 10.0
    kube.lose_answers(lambda call: call.plural == "leases" and call.verb == "replace", answer)
    claim = leases.acquire(kube, NAMESPACE, "s", "w1", 10, NOW, seen=seen)  # type: ignore[arg-type]
    assert claim is not None and (claim.holder, claim.fencing_token) == ("w1", 2)


def test_a_write_that_was_not_applied_is_not_taken_for_ours() -> None:
    # A 504 without the write behind it: the re-read shows someone else's Lease, the error stands.
    from shardops.k8s.api import ApiError

    kube = FakeKube()
    kube.fail = lambda call: (
        ApiError(504, "Timeout", "t", ambiguous=True)
        if call.verb == "create" and call.plural == "leases"
        else None
    )
    with pytest.raises(ApiError):
        leases.acquire(kube, NAMESPACE, "s", "w1", 10, NOW, seen=Renewals(lambda: 0.0))  # type: ignore[arg-type]
    assert kube.obj(LEASES, NAMESPACE, "s") is None


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize(
    ("campaign_stands", "reread_fails", "shard_gone"),
    [(True, False, True), (True, True, True), (False, False, True), (True, True, False)],
    ids=[
        "folded",
        "folded, the re-read failing once",
        "campaign deleted",
        "its Lease deleted, the Shard not yet, the re-read failing once",
    ],
)
def test_a_done_write_whose_answer_was_lost_and_whose_shard_was_folded_commits_its_result(
    tmp_path: Path, answer: LostAnswer, campaign_stands: bool, reread_fails: bool, shard_gone: bool
) -> None:
    """The operator folds a Done shard and deletes its Lease and then it within moments: the re-read
    that would recognise the Done write finds nothing (or, when the re-read fails, the retry's
    renewal finds no Lease, with the Shard still there or not). The write was applied all the same
    (only a Done shard is folded), so the result is committed for reuse; when the campaign itself
    went, it is not."""
    from shardops.api.enums import StoreType
    from shardops.api.store import ResultStoreStatus
    from shardops.k8s.api import CAMPAIGNS, SHARDS, ApiError
    from shardops.store.s3 import S3Store
    from tests.fakes3 import FakeS3

    kube = FakeKube()
    location = ResultStoreStatus(type=StoreType.S3, endpoint="http://127.0.0.1:1", bucket="results")
    body = _agent_campaign([{"id": 1}], shardSize=1)
    body["status"] = {"resultStore": location.to_dict()}
    (shard,) = add_campaign(kube, body)
    s3 = S3Store(location, NAMESPACE, client=FakeS3())
    rereads_to_fail = [ApiError(503, "ServiceUnavailable", "busy")] if reread_fails else []

    def folded_meanwhile(call: Call) -> BaseException:
        kube.objects.pop((LEASES.plural, NAMESPACE, shard.name))
        if shard_gone:
            kube.objects.pop((SHARDS.plural, NAMESPACE, shard.name))
        if not campaign_stands:
            kube.objects.pop((CAMPAIGNS.plural, NAMESPACE, body["metadata"]["name"]))
        kube.fail = lambda call: (
            rereads_to_fail.pop()
            if rereads_to_fail and call.method == "GET" and call.plural == "shards"
            else None
        )
        return answer(call)

    lost = kube.lose_answers(_status_write("Done"), folded_meanwhile)  # type: ignore[arg-type]
    worker = workerkit.worker(kube, tmp_path, max_shards=1)
    worker.shared.store(location.model_dump_json(), lambda: s3)
    assert worker.run() == 0
    assert len(lost) == 1
    assert not rereads_to_fail
    done = lost[0].body["status"]["result"]  # type: ignore[index]
    committed = s3.read_result(shard.spec.idempotency_key)
    fenced = sum(
        worker.metrics.sample("shardops_worker_fenced_total", reason=r) for r in ("deleted", "lease")
    )
    if campaign_stands:
        assert committed is not None and committed.name == done["ref"], "committed after the Done write"
        assert _shards_done(worker.metrics, "done") == 1
        assert fenced == 0
    else:
        assert committed is None, "nothing committed for a deleted campaign's retention to miss"
        assert fenced == 1
