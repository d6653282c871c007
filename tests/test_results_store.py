"""The result store: names, bodies, verification, size cap, create-if-absent and item merging."""

from __future__ import annotations

import hashlib
import json

import pytest

from fakekube import FakeKube
from shardops.k8s.api import CONFIGMAPS, Conflict
from shardops.logic.idempotency import fingerprint, item_subkey, key_label
from shardops.store.configmap import (
    BYTES_ANNOTATION,
    FINGERPRINT_ANNOTATION,
    check_result,
    data_size,
    decode_items,
    item_data_key,
    items_additions,
    items_name,
    read_items,
    read_result,
    result_body,
    result_name,
    save_items,
    store_result,
)
from shardops.store.records import (
    ItemRecord,
    ResultMeta,
    ResultTooLarge,
    StoreCorrupt,
    encode_result,
    store_label,
)
from workerkit import NAMESPACE

KEY = fingerprint({"shard": 1})
META = ResultMeta("camp", "camp-00000", "worker-a", 2)


def test_names_use_the_key_label_and_fit_kubernetes_limits() -> None:
    assert result_name(KEY) == "shardops-result-" + key_label(KEY)
    assert items_name(KEY) == "shardops-items-" + key_label(KEY)
    assert len(result_name(KEY)) <= 253
    # Keys in other spellings (the label form, or anything else) still get a valid, stable label.
    label_form = "sha256-" + "a" * 64
    assert store_label(label_form) == store_label(label_form) and len(store_label(label_form)) <= 63
    assert store_label("short-key") == "short-key"
    assert store_label("Not A Label!") != "Not A Label!"
    subkey = item_subkey({"id": 1})
    assert item_data_key(subkey) == "sha256-" + subkey.removeprefix("sha256:")


def test_result_text_is_canonical_and_its_fingerprint_is_the_sha256_of_its_bytes() -> None:
    entries = [(0, "k0", {"b": 1, "a": [1.0, 2]}), (1, "k1", "x")]
    text = encode_result(KEY, entries)
    assert text == encode_result(KEY, list(entries)), "same content, same bytes"
    assert json.loads(text) == {
        "idempotencyKey": KEY,
        "items": [
            {"index": 0, "key": "k0", "result": {"a": [1, 2], "b": 1}},
            {"index": 1, "key": "k1", "result": "x"},
        ],
    }
    body = result_body(KEY, text, META, 2)
    annotations = body["metadata"]["annotations"]
    assert annotations[FINGERPRINT_ANNOTATION] == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert annotations[FINGERPRINT_ANNOTATION] == fingerprint(json.loads(text))
    assert annotations[BYTES_ANNOTATION] == str(len(text.encode()))
    assert "ownerReferences" not in body["metadata"], "a result must outlive its Campaign"
    assert body["metadata"]["labels"]["shardops.dev/idempotency-key"] == key_label(KEY)


def test_check_result_refuses_anything_that_does_not_verify() -> None:
    text = encode_result(KEY, [(0, "k", 1)])
    good = result_body(KEY, text, META, 1)
    assert check_result(good, KEY).text == text
    tampered = json.loads(json.dumps(good))
    tampered["data"]["result.json"] = text.replace('"result":1', '"result":2')
    truncated = json.loads(json.dumps(good))
    truncated["data"]["result.json"] = text[:-5]
    wrong_size = json.loads(json.dumps(good))
    wrong_size["metadata"]["annotations"][BYTES_ANNOTATION] = "1"
    for bad in (tampered, truncated, wrong_size, {"metadata": {"name": "x"}, "data": {}}):
        with pytest.raises(StoreCorrupt):
            check_result(bad, KEY)
    with pytest.raises(StoreCorrupt, match="holds the result of"):
        check_result(good, fingerprint("another key"))


def test_item_records_verify_and_valid_entries_are_never_replaced() -> None:
    a, b = item_subkey({"id": 1}), item_subkey({"id": 2})
    existing = {item_data_key(a): ItemRecord({"v": 1}, 0.5).encode(), item_data_key(b): '{"result": 9}'}
    found, corrupt = decode_items(existing, [a, b])
    assert found == {a: ItemRecord({"v": 1}, 0.5)} and corrupt == [b]
    additions = items_additions(existing, {a: ItemRecord("new"), b: ItemRecord("fixed")})
    assert list(additions) == [item_data_key(b)], "the valid entry for a stays as it is"
    assert data_size({"ab": "cd"}) == 4


def test_store_result_creates_once_and_reuses_a_valid_result() -> None:
    kube = FakeKube()
    text = encode_result(KEY, [(0, "k", 1)])
    first, reused = store_result(kube, NAMESPACE, KEY, text, META, 1, cap=10_000)  # type: ignore[arg-type]
    assert not reused and first.text == text
    other = encode_result(KEY, [(0, "k", 2)])
    second, reused = store_result(kube, NAMESPACE, KEY, other, META, 1, cap=10_000)  # type: ignore[arg-type]
    assert reused and second.text == text, "a stored valid result is never overwritten"
    assert read_result(kube, NAMESPACE, KEY) == first  # type: ignore[arg-type]


def test_store_result_replaces_a_corrupt_result_at_its_version() -> None:
    kube = FakeKube()
    text = encode_result(KEY, [(0, "k", 1)])
    broken = result_body(KEY, text, META, 1)
    broken["data"]["result.json"] = text[:10]
    kube.put(CONFIGMAPS, NAMESPACE, broken)
    with pytest.raises(StoreCorrupt):
        read_result(kube, NAMESPACE, KEY)  # type: ignore[arg-type]
    stored, reused = store_result(kube, NAMESPACE, KEY, text, META, 1, cap=10_000)  # type: ignore[arg-type]
    assert not reused and stored.text == text
    assert read_result(kube, NAMESPACE, KEY) == stored  # type: ignore[arg-type]


def test_size_cap_refuses_before_writing_anything() -> None:
    kube = FakeKube()
    text = encode_result(KEY, [(0, "k", "x" * 500)])
    with pytest.raises(ResultTooLarge, match=r"would take \d+ bytes, over the result size cap of 100 bytes"):
        store_result(kube, NAMESPACE, KEY, text, META, 1, cap=100)  # type: ignore[arg-type]
    with pytest.raises(ResultTooLarge, match="item results of shard camp-00000 take"):
        save_items(kube, NAMESPACE, KEY, "camp", {"k": ItemRecord("x" * 500)}, cap=100, shard="camp-00000")  # type: ignore[arg-type]
    assert kube.write_log() == []


def test_save_items_adds_only_new_entries_and_survives_a_concurrent_writer() -> None:
    kube = FakeKube()
    a, b, c = (item_subkey({"id": i}) for i in range(3))
    assert save_items(kube, NAMESPACE, KEY, "camp", {a: ItemRecord(1)}, cap=10_000) == 1  # type: ignore[arg-type]
    assert save_items(kube, NAMESPACE, KEY, "camp", {a: ItemRecord(1)}, cap=10_000) == 0  # type: ignore[arg-type]

    raced = []

    def another_writer(fake: FakeKube, verb: str, resource: object, name: str) -> None:
        if verb == "patch" and not raced:
            raced.append(name)
            current = fake.obj(CONFIGMAPS, NAMESPACE, name)
            assert current is not None
            fake.put(
                CONFIGMAPS,
                NAMESPACE,
                {**current, "data": {**current["data"], item_data_key(c): ItemRecord(3).encode()}},
            )

    kube.before.append(another_writer)
    assert save_items(kube, NAMESPACE, KEY, "camp", {b: ItemRecord(2)}, cap=10_000) == 1  # type: ignore[arg-type]
    assert kube.writes_to("configmaps", ok=False) == [("patch", "configmaps", items_name(KEY), 409)]
    found, corrupt = read_items(kube, NAMESPACE, KEY, [a, b, c])  # type: ignore[arg-type]
    assert found == {a: ItemRecord(1), b: ItemRecord(2), c: ItemRecord(3)} and corrupt == []


def test_save_items_gives_up_with_conflict_when_the_configmap_never_settles() -> None:
    kube = FakeKube()
    save_items(kube, NAMESPACE, KEY, "camp", {"a": ItemRecord(1)}, cap=10_000)  # type: ignore[arg-type]

    def always(fake: FakeKube, verb: str, resource: object, name: str) -> None:
        current = fake.obj(CONFIGMAPS, NAMESPACE, name)
        if verb == "patch" and current is not None:
            fake.put(CONFIGMAPS, NAMESPACE, current)

    kube.before.append(always)
    with pytest.raises(Conflict):
        save_items(kube, NAMESPACE, KEY, "camp", {"b": ItemRecord(2)}, cap=10_000)  # type: ignore[arg-type]
