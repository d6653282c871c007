"""The million-item scenario's pure parts (benchmarks/scenarios/million.py): when it runs, what it
reads from the S3 store's listing and from its samples."""

from __future__ import annotations

from benchmarks.__main__ import wanted
from benchmarks.plan import FULL, QUICK, SMOKE, narrowed
from benchmarks.runs import Sample
from benchmarks.scenarios.million import INPUTS, STORE_OBJECT_KINDS, start_middle_end, store_objects
from benchmarks.scenarios.scale import compact_item, compact_items, jsonl


def test_the_full_sets_million_runs_only_when_asked_for_and_the_quick_set_runs_its_own() -> None:
    assert [c.items for c in FULL.million] == [1_000_000]
    assert not wanted("million", FULL, frozenset())
    assert wanted("million", FULL, frozenset({"million"}))
    asked = narrowed(FULL, frozenset({"1m"}), None)
    assert wanted("million", asked, frozenset()) and [c.key for c in asked.million] == ["1m"]
    assert narrowed(FULL, frozenset({"100k"}), None).million_on_request, "another case asks nothing"
    assert wanted("million", QUICK, frozenset()) and QUICK.million[0].shard_size == FULL.million[0].shard_size
    assert not wanted("million", SMOKE, frozenset()), "the smoke set has no million case"
    assert not wanted("million", QUICK, frozenset({"scale"}))
    assert wanted("scale", FULL, frozenset()) and not wanted("many", SMOKE, frozenset())


def test_the_items_are_generated_one_by_one_as_the_scale_runs_compact_ones() -> None:
    generated = (compact_item(n, 200) for n in range(1000))
    assert jsonl(generated) == jsonl(compact_items(1000, 200))
    # A million items at shardSize 200 stay a small object (each line at most 13 bytes).
    assert len(jsonl(compact_item(n, 200) for n in range(999_990, 1_000_000)).splitlines()[0]) <= 13


def test_the_store_listing_is_told_apart_by_kind() -> None:
    area = "bench-ns/ns/"
    found = store_objects(
        [
            (f"{area}attempts/k1/t3.json", 100),
            (f"{area}attempts/k2/t4.json", 50),
            (f"{area}results/k1.json", 10),
            (f"{area}ledger/camp-uid/1-ab.jsonl", 7),
            (f"{area}million-1m-items.jsonl", 1000),
            (f"{area}_other/x", 1),
        ],
        area,
    )
    assert found == {
        STORE_OBJECT_KINDS["attempts"]: [2, 150],
        STORE_OBJECT_KINDS["results"]: [1, 10],
        STORE_OBJECT_KINDS["ledger"]: [1, 7],
        INPUTS: [1, 1000],
        "_other": [1, 1],
    }


def test_start_middle_and_end_are_the_first_nearest_halfway_and_last_known_values() -> None:
    def sample(at: float, rss: int | None) -> Sample:
        return Sample(at, {}, None, None, worker_rss=rss)

    samples = [sample(0, None), sample(1, 10), sample(2, 20), sample(5, 50), sample(9, 90), sample(10, None)]
    assert start_middle_end(samples, lambda s: s.worker_rss) == (10, 50, 90)
    assert start_middle_end([sample(0, None)], lambda s: s.worker_rss) == (None, None, None)
