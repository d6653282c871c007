"""The result objects behind a run's Done writes, checked in the S3 store itself.

The checker (`checker.py`) sees what the API server stored; whether each Done shard's result is
really in the store, whole and committed, only the store can say. For every Done write of the
history: the key's committed pointer exists and names the object the Done write recorded (ref,
fingerprint, bytes); that object is the one the claim the Done completed wrote (the attempt object of
its fencing token: `attempts/<key>/t<token>.json`, so a stale holder's object never became the
result); its content hashes to the fingerprint (`S3Store.read_result` verifies). One committed
result per key follows from the layout (the pointer is written once, If-None-Match).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from shardops.store.records import StoreCorrupt
from shardops.store.s3 import S3Store
from testbed.faults.checker import Violation, done_writes
from testbed.faults.history import History, key_text


def check_results(history: History, store: S3Store, tally: Counter[str]) -> Iterator[Violation]:
    """Every Done write's result as the store holds it (module docstring)."""
    for key_of_shard, before, done in done_writes(history):
        where = f"shard {key_text(key_of_shard)}"
        recorded = done.result or {}
        key = str(done.spec.get("idempotencyKey") or "")
        try:
            committed = store.read_result(key)
        except StoreCorrupt as corrupt:
            yield Violation("result-in-store", where, f"{done.where()}: {corrupt}")
            continue
        tally["results verified in the store"] += 1
        if committed is None:
            yield Violation("result-in-store", where, f"{done.where()}: no committed result for key {key}")
            continue
        seen = (committed.name, committed.fingerprint, committed.bytes)
        wanted = (recorded.get("ref"), recorded.get("fingerprint"), recorded.get("bytes"))
        if seen != wanted:
            yield Violation(
                "result-in-store",
                where,
                f"{done.where()} recorded {wanted}, the store committed {seen}",
            )
        token = before.fencing_token if before is not None else None
        if token is not None and committed.name != store.attempt_name(key, token):
            yield Violation(
                "result-in-store",
                where,
                f"{done.where()} completed the claim of token {token}, but the committed result "
                f"{committed.name} is not that claim's object ({store.attempt_name(key, token)})",
            )
