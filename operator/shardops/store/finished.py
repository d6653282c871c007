"""A shard whose result verifies in the store is finished: it goes Done, never Failed or Blocked.

A claim can store its whole result and then lose its Done write — the API server answered with
errors until the lease ran out, or the worker died between the two. Judged by its Lease alone, the
shard is a zombie, and on its last attempt the zombie rule would block it with its result sitting
verified in the store. So whoever judges a zombie (the operator's lease sweep, a worker that took
the expired Lease over) first looks the result up — the key's result, or the lost claim's own
result object (`ResultStore.find_result`, at most two reads) — and completes the shard with it.
"""

from __future__ import annotations

import logging

from shardops.api.shard import Progress, Shard, ShardResult
from shardops.k8s.shards import TransitionRequest
from shardops.logic.transitions import Action
from shardops.store import ResultStore
from shardops.store.records import StoreCorrupt, StoredResult, StoreUnavailable

log = logging.getLogger(__name__)


def stored_result_of(store: ResultStore, shard: Shard) -> StoredResult | None:
    """The verified result of the shard's key, or of its current claim (status.fencingToken); None
    when there is none, or when it does not verify (then it is computed again). StoreUnavailable
    propagates: the caller decides later, not without looking.

    A shard rerunning its errored items (status.rerunErrored) is finished only by its claim's own
    result: the key's committed one is the result those items errored in (a commit never replaces
    it), and completing the zombie with it would drop the rerun."""
    status = shard.current_status
    try:
        return store.find_result(
            shard.spec.idempotency_key, status.fencing_token, committed=not status.rerun_errored
        )
    except StoreCorrupt as corrupt:
        log.warning("%s: the stored result does not verify (%s); it is computed again", shard.name, corrupt)
        return None


def completion(shard: Shard, stored: StoredResult, message: str) -> TransitionRequest:
    """Running -> Done with `stored` as the result: the claim goes, progress is total/total."""
    total = shard.spec.item_count
    return TransitionRequest(
        Action.COMPLETE,
        f"{message}: its result {stored.name} ({stored.bytes} bytes, {stored.fingerprint}) is stored "
        "and verifies",
        updates={
            "owner": None,
            "lease_until": None,
            "last_heartbeat": None,
            "not_before": None,
            "fencing_token": None,
            "progress": Progress(done=total, total=total),
            "result": ShardResult(ref=stored.name, fingerprint=stored.fingerprint, bytes=stored.bytes),
        },
    )


def commit_recorded(store: ResultStore, shard: Shard) -> None:
    """Commit the result a Done shard's status records, for reuse, unless the key has one (then that
    one stays). The fold does this before the shard's facts go to the ledger: the worker commits
    right after its Done write, but a worker killed between the two (or whose re-read could not
    recognise the write) never does, and a Done shard's result is then the key's all the same.
    StoreUnavailable propagates (the fold waits for the store)."""
    result = shard.current_status.result
    if result is None:
        return
    stored = StoredResult(result.ref, result.fingerprint, result.bytes, "", {})
    store.commit(shard.spec.idempotency_key, stored)


def commit_for_reuse(store: ResultStore, shard: Shard, stored: StoredResult) -> None:
    """After the shard's Done write: make `stored` the key's result for reuse. If that fails the
    shard is Done all the same, and the operator's fold commits it (`commit_recorded`)."""
    try:
        store.commit(shard.spec.idempotency_key, stored)
    except StoreUnavailable as error:
        log.warning("%s: could not commit result %s for reuse: %s", shard.name, stored.name, error)
