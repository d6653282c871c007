"""A shard whose result is stored is finished: API trouble on the way to Done is retried while the
lease lasts, and nothing — the worker's failure path, a worker reclaiming the zombie — Fails or
Blocks a shard whose result verifies in the store.

Every campaign here has maxAttempts 1 (or a zombie on its last attempt): one attempt charged
wrongly is a Blocked shard, which is what the defect looked like.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import urllib3

from shardops.api.shard import Shard
from shardops.k8s.api import CONFIGMAPS, ApiError, Invalid
from shardops.logic.idempotency import item_subkey
from shardops.store.configmap import OWNER_ANNOTATION, ConfigMapStore, attempt_name, store_result
from shardops.store.records import ResultMeta, encode_result
from tests import workerkit
from tests.fakekube import Call, FakeKube
from tests.worker.test_runtime import _agent_campaign, _on_its_last_attempt, _reasons, _shard, _zombie
from tests.workerkit import NAMESPACE, ShiftedClock, add_campaign, watching_worker


def _done_write(call: Call) -> bool:
    body = call.body if isinstance(call.body, dict) else {}
    return call.plural == "shards" and (body.get("status") or {}).get("phase") == "Done"


def _failing(match: object, errors: list[BaseException]) -> object:
    """A `FakeKube.fail` that refuses the writes `match` picks with `errors`, one each, in order."""

    def fail(call: Call) -> BaseException | None:
        if errors and match(call):  # type: ignore[operator]
            return errors.pop(0)
        return None

    return fail


def _completed_on_the_first_attempt(kube: FakeKube, shard: Shard) -> None:
    done = _shard(kube, shard.name)
    assert done.phase == "Done", done.current_status.last_error
    assert _reasons(done) == [("Materialized", 1), ("Claimed", 1), ("Completed", 1)]
    result = done.current_status.result
    key = shard.spec.idempotency_key
    assert result is not None and result.ref == attempt_name(key, 1), "the claim's own result"
    committed = ConfigMapStore(kube, NAMESPACE).read_result(key)  # type: ignore[arg-type]
    assert committed is not None and committed.name == result.ref, "committed after the Done write"


@pytest.mark.parametrize(
    "errors",
    [
        pytest.param([ApiError(503, "ServiceUnavailable", "busy")] * 5, id="five 503s"),
        pytest.param(
            [urllib3.exceptions.ReadTimeoutError(None, "/", "Read timed out.")], id="a read timeout"
        ),  # type: ignore[arg-type]
    ],
)
def test_a_done_write_refused_for_a_transient_reason_is_retried_while_the_lease_lasts(
    tmp_path: Path, errors: list[BaseException]
) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1, maxAttempts=1))
    kube.fail = _failing(_done_write, list(errors))  # type: ignore[assignment]
    assert workerkit.worker(kube, tmp_path, max_shards=1).run() == 0
    _completed_on_the_first_attempt(kube, shard)
    refused = [c for c in kube.calls if _done_write(c) and c.status != 200]
    assert len(refused) == len(errors)


def test_a_renewal_on_the_way_to_done_refused_for_a_transient_reason_is_retried(tmp_path: Path) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1, maxAttempts=1))
    errors: list[BaseException] = [ApiError(500, "InternalError", "etcd")] * 3
    kube.fail = _failing(lambda c: c.plural == "leases" and c.verb == "patch", errors)  # type: ignore[assignment]
    assert workerkit.worker(kube, tmp_path, max_shards=1).run() == 0
    assert errors == []
    _completed_on_the_first_attempt(kube, shard)


def test_an_error_after_the_result_was_stored_completes_the_shard_not_fails_it(
    tmp_path: Path,
) -> None:
    # Not a transient error (a 422 the API server should never send for this write): the failure
    # path takes it, and finds the result stored — the shard is finished, not Blocked.
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1, maxAttempts=1))
    errors: list[BaseException] = [Invalid(422, "Invalid", "surprise")]
    kube.fail = _failing(_done_write, errors)  # type: ignore[assignment]
    assert workerkit.worker(kube, tmp_path, max_shards=1).run() == 0
    assert errors == []
    _completed_on_the_first_attempt(kube, shard)


def _store_result_of(kube: FakeKube, shard: Shard, owner: str) -> str:
    key = shard.spec.idempotency_key
    entries = [(i, item_subkey(item), {"by": owner}) for i, item in enumerate(shard.spec.items or [])]
    stored, _ = store_result(
        kube,
        NAMESPACE,
        key,
        encode_result(key, entries),
        ResultMeta("camp", shard.name, owner, 2, 1),
        1,
        10_000,
    )  # type: ignore[arg-type]
    return stored.fingerprint


def test_a_zombie_on_its_last_attempt_whose_result_verifies_is_completed_not_blocked(tmp_path: Path) -> None:
    kube = FakeKube()
    marker = tmp_path / "ran"
    body = _on_its_last_attempt(["touch", str(marker)])
    (shard,) = add_campaign(kube, body)
    _zombie(kube, shard, attempt=2)
    # The dead worker stored its whole result, then lost its Done write.
    fingerprint = _store_result_of(kube, shard, "dead-worker")
    assert watching_worker(kube, tmp_path, 10).run() == 0
    done = _shard(kube, shard.name)
    status = done.current_status
    assert status.phase == "Done" and status.attempt == 2, "no attempt charged"
    assert _reasons(done)[-1] == ("Completed", 2)
    assert status.result is not None and status.result.fingerprint == fingerprint
    assert status.owner is None and status.fencing_token is None and status.lease_until is None
    assert status.progress is not None and (status.progress.done, status.progress.total) == (1, 1)
    assert not marker.exists(), "a finished shard is not run again"


def test_a_zombie_whose_lost_claim_stored_its_s3_result_is_completed_with_that_object(tmp_path: Path) -> None:
    from shardops.api.enums import StoreType
    from shardops.api.store import ResultStoreStatus
    from shardops.store.s3 import S3Store
    from tests.fakes3 import FakeS3

    kube = FakeKube()
    marker = tmp_path / "ran"
    body = _on_its_last_attempt(["touch", str(marker)])
    location = ResultStoreStatus(type=StoreType.S3, endpoint="http://127.0.0.1:1", bucket="results")
    body["status"] = {"resultStore": location.to_dict()}
    (shard,) = add_campaign(kube, body)
    _zombie(kube, shard, attempt=2)
    s3 = S3Store(location, NAMESPACE, client=FakeS3())
    key = shard.spec.idempotency_key
    text = encode_result(key, [(0, item_subkey({"id": 1}), "by the dead worker")])
    # The dead claim (fencing token 1) wrote its object; its Done write, and so the commit, never came.
    stored, _ = s3.store_result(key, text, ResultMeta("camp", shard.name, "dead-worker", 2, 1), 1)
    assert s3.read_result(key) is None
    worker = workerkit.worker(kube, tmp_path, clock=ShiftedClock())
    worker.shared.store(location.model_dump_json(), lambda: s3)
    assert worker._step() is None, "first seen now: not a zombie yet"
    worker.clock.skip(10)  # type: ignore[attr-defined]
    assert worker.run() == 0
    status = _shard(kube, shard.name).current_status
    assert status.phase == "Done" and status.attempt == 2 and status.result is not None
    assert (status.result.ref, status.result.fingerprint) == (stored.name, stored.fingerprint)
    committed = s3.read_result(key)
    assert committed is not None and committed.name == stored.name, "committed for reuse"
    assert not marker.exists()


def test_a_zombie_whose_stored_result_does_not_verify_is_blocked_on_its_last_attempt(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    body = _on_its_last_attempt(["true"])
    (shard,) = add_campaign(kube, body)
    _zombie(kube, shard, attempt=2)
    _store_result_of(kube, shard, "dead-worker")
    configmap = kube.obj(CONFIGMAPS, NAMESPACE, attempt_name(shard.spec.idempotency_key, 1))
    assert configmap is not None
    configmap["data"]["result.json"] += " "  # its fingerprint no longer matches
    assert watching_worker(kube, tmp_path, 10).run() == 0
    assert _shard(kube, shard.name).phase == "Blocked"


def test_a_stale_holders_result_stored_during_the_live_claim_is_never_the_shards_result(
    tmp_path: Path,
) -> None:
    """The zombie's holder was only frozen: it thaws while the live claim (token 2) runs and stores its
    own result (token 1) before its next renewal fences it. The live claim completes the shard with
    the result it computed, and that is the key's result, not the stale one (whose content differs:
    commands are often nondeterministic)."""
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1))
    _zombie(kube, shard, attempt=1)
    key = shard.spec.idempotency_key
    stale: list[str] = []

    def stale_holder_stores_first(fake: FakeKube, verb: str, resource: object, name: str) -> None:
        if (
            verb == "create"
            and resource is CONFIGMAPS
            and name.startswith(("shardops-result-", "shardops-attempt-"))
        ):
            fake.before.clear()  # once: the stale holder's own create comes through here too
            stale.append(_store_result_of(kube, shard, "dead-worker"))

    kube.before.append(stale_holder_stores_first)
    assert watching_worker(kube, tmp_path, 10).run() == 0
    assert stale, "the stale holder stored its result while the live claim ran"
    done = _shard(kube, shard.name)
    assert _reasons(done)[-3:] == [("LeaseExpired", 1), ("Claimed", 2), ("Completed", 2)]
    result = done.current_status.result
    assert result is not None and result.fingerprint != stale[0]
    store = ConfigMapStore(kube, NAMESPACE)  # type: ignore[arg-type]
    recorded = store.read_ref(result.ref, key)
    assert recorded.annotations[OWNER_ANNOTATION] != "dead-worker"
    assert [entry["result"]["attempt"] for entry in json.loads(recorded.text)["items"]] == [2]
    committed = store.read_result(key)
    assert committed == recorded, "the key's result is the live claim's, for every later reuse"
