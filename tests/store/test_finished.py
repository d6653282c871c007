"""Finishing a zombie with its stored result (`store.finished`): which stored result may finish it."""

from __future__ import annotations

from typing import Any

from shardops.api.shard import Shard
from shardops.logic.idempotency import fingerprint
from shardops.store.configmap import ConfigMapStore
from shardops.store.finished import stored_result_of
from shardops.store.records import ResultMeta, encode_result
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE

KEY = fingerprint({"shard": 0})


def _running(token: int, **status: Any) -> Shard:
    return Shard.parse(
        {
            "metadata": {"name": "camp-00000", "namespace": NAMESPACE, "uid": "u0"},
            "spec": {"campaign": "camp", "index": 0, "items": [{"id": 0}], "idempotencyKey": KEY},
            "status": {"phase": "Running", "attempt": 1, "fencingToken": token, **status},
        }
    )


def test_a_rerun_of_errored_items_is_finished_only_by_its_own_claims_result() -> None:
    """The key's committed result is the one the items errored in (a commit never replaces it): a
    zombie rerunning them (status.rerunErrored) is not completed with it, only with what its own
    claim stored; any other zombie is completed with the key's result."""
    store = ConfigMapStore(FakeKube(), NAMESPACE)  # type: ignore[arg-type]
    errored_text = encode_result(KEY, [(0, "k", {"error": {"message": "400"}})])
    errored, _ = store.store_result(KEY, errored_text, ResultMeta("camp", "camp-00000", "w1", 1, 1), 1)
    store.commit(KEY, errored)
    rerun = _running(2, rerunErrored=True)
    assert stored_result_of(store, _running(2)) == store.read_result(KEY)
    assert stored_result_of(store, rerun) is None, "the errored result would drop the rerun"
    fixed_text = encode_result(KEY, [(0, "k", "answer")])
    fixed, _ = store.store_result(KEY, fixed_text, ResultMeta("camp", "camp-00000", "w2", 1, 2), 1)
    found = stored_result_of(store, rerun)
    assert found is not None and found.name == fixed.name and found.text == fixed_text
