"""The finalize shard's read of a large ledger (state/results.py, store/s3.py): one segment at a
time, only a compact entry kept per folded Done shard, and a hook between segments where the
worker renews its claim (issue 31: the whole ledger was read into memory before any renewal)."""

from __future__ import annotations

import tracemalloc

from shardops.api.campaign import Campaign
from shardops.api.enums import StoreType
from shardops.api.folded import FoldedShards, IndexRange
from shardops.api.store import ResultStoreStatus
from shardops.state import results
from shardops.store.s3 import S3Store
from tests.fakes3 import FakeS3

LOCATION = ResultStoreStatus(type=StoreType.S3, endpoint="http://127.0.0.1:1", bucket="results")
SEGMENTS, PER_SEGMENT = 12, 200
# A ledger line's history as a long-run shard has it: ~4 KB of entries.
HISTORY = [
    {"phase": p, "at": "2026-03-01T12:00:00+00:00", "reason": r, "attempt": 1, "owner": "w-" + "x" * 40}
    for p, r in [("Pending", "Materialized"), ("Running", "Claimed"), ("Done", "Completed")] * 8
]


def _line(index: int, phase: str) -> dict[str, object]:
    return {
        "index": index,
        "shard": f"camp-{index:06d}",
        "phase": phase,
        "itemRange": {"start": index, "end": index + 1},
        "items": 1,
        "idempotencyKey": f"{index:064x}",
        "result": {"ref": f"attempts/{index:064x}/t1.json", "fingerprint": "sha256:" + "0" * 64, "bytes": 9}
        if phase == "Done"
        else None,
        "lastError": {"class": "invalid-input", "message": "bad"} if phase != "Done" else None,
        "attempt": 1,
        "history": HISTORY,
    }


def _campaign() -> Campaign:
    return Campaign.parse(
        {
            "apiVersion": "shardops.dev/v1alpha1",
            "kind": "Campaign",
            "metadata": {"name": "camp", "namespace": "ns", "uid": "u1"},
            "spec": {"items": [], "shardSize": 1, "worker": {"image": "img", "command": ["agent"]}},
        }
    )


def _read_peak(segments: int) -> tuple[int, int, int]:
    """(peak bytes allocated by the finalize shard's ledger read, Done shards read, renewal points)
    for a ledger of `segments` full segments, 10 % of its lines Failed."""
    store = S3Store(LOCATION, "ns", client=FakeS3())
    total = segments * PER_SEGMENT
    for segment in range(segments):
        lines = [
            _line(i, "Failed" if i % 10 == 3 else "Done")
            for i in range(segment * PER_SEGMENT, (segment + 1) * PER_SEGMENT)
        ]
        store.write_ledger("camp", "u1", segment + 1, lines)
    folded = FoldedShards(
        shards=total - total // 10,
        failed=total // 10,
        done_ranges=[IndexRange(start=0, end=total)],
        sequence=segments,
    )
    renewals: list[int] = []
    read = results.ledger_of(store, _campaign(), lambda: renewals.append(len(renewals)))
    tracemalloc.start()
    try:
        finished = results.finished_shards("camp", [], folded, read)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [f.first_item for f in finished[:4]] == [0, 1, 2, 4], "item order, Done ones only"
    return peak, len(finished), len(renewals)


def test_the_ledger_streams_a_segment_at_a_time_with_a_renewal_between_segments() -> None:
    """Bounded: one segment (at most 500 lines) plus a compact entry per Done shard, whatever the
    ledger's size. Read whole, as before, every line stayed in memory with its history: ~2.7 KB more
    per shard in this ledger (measured); now ~0.7 KB."""
    small_peak, small_done, small_renewals = _read_peak(4)
    large_peak, large_done, large_renewals = _read_peak(12)
    assert (small_done, large_done) == (720, 2160)
    assert (small_renewals, large_renewals) == (4, 12), "a renewal point after every segment"
    per_shard = (large_peak - small_peak) / (large_done - small_done)
    assert per_shard < 1000, per_shard


def test_a_shard_listed_live_and_already_folded_counts_once() -> None:
    """A fold records a shard in the status, then deletes it: read between the two, the shard is both
    in the list and in the ledger. The Batch API's output file had its lines twice (seen in CI)."""
    from shardops.api.shard import Shard
    from tests.schedulerkit import shard

    store = S3Store(LOCATION, "ns", client=FakeS3())
    store.write_ledger("camp", "u1", 1, [_line(0, "Done"), _line(1, "Done")])
    folded = FoldedShards(shards=2, done_ranges=[IndexRange(start=0, end=2)], sequence=1)
    result = {"ref": "attempts/x/t1.json", "fingerprint": "sha256:" + "0" * 64, "bytes": 9}
    live = []
    for index in (1, 2):
        body = shard("camp", index, "Done", result=result)
        body["spec"]["itemRange"] = {"start": index, "end": index + 1}
        live.append(Shard.parse(body))
    finished = results.finished_shards("camp", live, folded, results.ledger_of(store, _campaign()))
    assert [f.shard for f in finished] == ["camp-000000", "camp-000001", "camp-00002"]
