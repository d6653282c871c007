"""testbed/faults/results.py: each Done write's result, checked in the store (the in-memory S3)."""

from __future__ import annotations

from collections import Counter

from testbed.faults.results import check_results

from shardops.api.enums import StoreType
from shardops.api.store import ResultStoreStatus
from shardops.logic.idempotency import item_subkey
from shardops.store.records import ResultMeta, encode_result
from shardops.store.s3 import S3Store
from tests.fakes3 import FakeS3
from tests.testbed.test_fault_checker import FINGERPRINT, run

LOCATION = ResultStoreStatus(type=StoreType.S3, endpoint="http://127.0.0.1:1", bucket="results")


def _recorded(planted: str | None = None) -> tuple[object, S3Store]:
    """The checker's synthetic run, its Done writes pointing at results really in the store."""
    recording = run()
    store = S3Store(LOCATION, "ns", client=FakeS3())
    # Who completed each shard, with which fencing token (the run's story: A, B, B).
    tokens = {"s0": 1, "s1": 2, "s2": 2}
    for entry in recording.entries:
        body = entry.get("responseObject") or {}
        status = body.get("status")
        if not isinstance(status, dict) or status.get("phase") != "Done":
            continue
        if entry["objectRef"].get("subresource") != "status":
            continue
        name = body["metadata"]["name"]
        key = body["spec"]["idempotencyKey"]
        text = encode_result(key, [(0, item_subkey({"n": name}), f"answer {name}")])
        token = tokens[name] + (1 if planted == "another-claims-object" and name == "s1" else 0)
        stored, _ = store.store_result(key, text, ResultMeta("camp", name, "w", 1, token), 1)
        if not (planted == "never-committed" and name == "s2"):
            store.commit(key, stored)
        status["result"] = {"ref": stored.name, "fingerprint": stored.fingerprint, "bytes": stored.bytes}
    assert FINGERPRINT  # the run's own placeholder is replaced by what the store holds
    return recording.history(), store


def test_results_that_are_in_the_store_and_committed_by_their_claim_pass() -> None:
    history, store = _recorded()
    tally: Counter[str] = Counter()
    assert list(check_results(history, store, tally)) == []  # type: ignore[arg-type]
    assert tally["results verified in the store"] == 3


def test_a_done_shard_whose_result_was_never_committed_is_reported() -> None:
    history, store = _recorded("never-committed")
    found = [(v.invariant, v.object) for v in check_results(history, store, Counter())]  # type: ignore[arg-type]
    assert found == [("result-in-store", "shard ns/s2")]


def test_a_result_written_under_another_claims_token_is_reported() -> None:
    history, store = _recorded("another-claims-object")
    (violation,) = check_results(history, store, Counter())  # type: ignore[arg-type]
    assert violation.object == "shard ns/s1" and "token 2" in violation.detail
