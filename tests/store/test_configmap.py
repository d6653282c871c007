"""The result store: names, bodies, verification, size cap, create-if-absent and item merging."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from shardops.k8s.api import CONFIGMAPS, Conflict
from shardops.logic.idempotency import fingerprint, item_subkey, key_label
from shardops.store.configmap import (
    BYTES_ANNOTATION,
    FINGERPRINT_ANNOTATION,
    TOKEN_ANNOTATION,
    ConfigMapStore,
    attempt_body,
    attempt_name,
    check_result,
    data_size,
    decode_items,
    find_result,
    item_data_key,
    items_additions,
    items_name,
    read_items,
    read_result,
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
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE

KEY = fingerprint({"shard": 1})
META = ResultMeta("camp", "camp-00000", "worker-a", 2, 5)
# A ConfigMap's name is a DNS subdomain of at most 253 characters.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_names_use_the_key_label_and_fit_kubernetes_limits() -> None:
    assert result_name(KEY) == "shardops-result-" + key_label(KEY)
    assert items_name(KEY) == "shardops-items-" + key_label(KEY)
    assert attempt_name(KEY, 7) == "shardops-attempt-" + key_label(KEY) + "-t7"
    for name in (result_name(KEY), items_name(KEY), attempt_name(KEY, 2**64)):
        assert len(name) <= 253 and DNS_SUBDOMAIN.match(name), name
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
    body = attempt_body(KEY, text, META, 2)
    assert body["metadata"]["name"] == attempt_name(KEY, 5), "the claim's own ConfigMap, by its token"
    annotations = body["metadata"]["annotations"]
    assert annotations[TOKEN_ANNOTATION] == "5"
    assert annotations[FINGERPRINT_ANNOTATION] == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert annotations[FINGERPRINT_ANNOTATION] == fingerprint(json.loads(text))
    assert annotations[BYTES_ANNOTATION] == str(len(text.encode()))
    assert "ownerReferences" not in body["metadata"], "a result must outlive its Campaign"
    assert body["metadata"]["labels"]["shardops.dev/idempotency-key"] == key_label(KEY)


def test_check_result_refuses_anything_that_does_not_verify() -> None:
    text = encode_result(KEY, [(0, "k", 1)])
    good = attempt_body(KEY, text, META, 1)
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


def test_store_result_replaces_a_corrupt_attempt_of_its_claim_at_its_version() -> None:
    kube = FakeKube()
    text = encode_result(KEY, [(0, "k", 1)])
    broken = attempt_body(KEY, text, META, 1)
    broken["data"]["result.json"] = text[:10]
    kube.put(CONFIGMAPS, NAMESPACE, broken)
    with pytest.raises(StoreCorrupt):
        find_result(kube, NAMESPACE, KEY, META.token)  # type: ignore[arg-type]
    stored, reused = store_result(kube, NAMESPACE, KEY, text, META, 1, cap=10_000)  # type: ignore[arg-type]
    assert not reused and stored.text == text
    assert find_result(kube, NAMESPACE, KEY, META.token) == stored  # type: ignore[arg-type]
    assert kube.writes_to("configmaps") == [("replace", "configmaps", attempt_name(KEY, 5), 200)]


def test_an_attempt_another_shard_stored_under_the_same_token_is_kept_as_a_result_of_the_input() -> None:
    # Another Shard with this key whose Lease gave the same token: another campaign's, or a leftover
    # of a deleted Campaign of the same name. Same key, same input: kept, as the S3 store keeps it,
    # not refused (which would charge this shard an attempt per leftover token).
    kube = FakeKube()
    store = ConfigMapStore(kube, NAMESPACE)  # type: ignore[arg-type]
    other = ResultMeta("other", "other-00000", "w", 2, 5)
    theirs, _ = store.store_result(KEY, encode_result(KEY, [(0, "k", "theirs")]), other, 1)
    ours, reused = store.store_result(KEY, encode_result(KEY, [(0, "k", "ours")]), META, 1)
    assert ours == theirs and not reused
    assert kube.writes_to("configmaps") == [("create", "configmaps", attempt_name(KEY, 5), 200)]


def test_commit_creates_a_small_pointer_to_the_claims_configmap() -> None:
    kube = FakeKube()
    store = ConfigMapStore(kube, NAMESPACE)  # type: ignore[arg-type]
    stored, _ = store.store_result(KEY, encode_result(KEY, [(0, "k", "x" * 5000)]), META, 1)
    store.commit(KEY, stored)
    pointer = kube.obj(CONFIGMAPS, NAMESPACE, result_name(KEY))
    assert pointer is not None and "result.json" not in pointer["data"]
    assert json.loads(pointer["data"]["pointer.json"]) == {
        "idempotencyKey": KEY,
        "ref": attempt_name(KEY, 5),
        "fingerprint": stored.fingerprint,
        "bytes": stored.bytes,
    }
    assert pointer["metadata"]["labels"] == {
        "shardops.dev/idempotency-key": key_label(KEY),
        "shardops.dev/campaign": "camp",
    }, "purged and cleaned up by the same labels as the rest"
    assert data_size(pointer["data"]) < 500 < stored.bytes
    assert read_result(kube, NAMESPACE, KEY) == stored  # type: ignore[arg-type]


def test_a_committed_result_whose_attempt_does_not_verify_is_corrupt() -> None:
    kube = FakeKube()
    store = ConfigMapStore(kube, NAMESPACE)  # type: ignore[arg-type]
    stored, _ = store.store_result(KEY, encode_result(KEY, [(0, "k", 1)]), META, 1)
    store.commit(KEY, stored)
    attempt = kube.obj(CONFIGMAPS, NAMESPACE, stored.name)
    assert attempt is not None
    edited = encode_result(KEY, [(0, "k", 2)])
    attempt["data"]["result.json"] = edited
    attempt["metadata"]["annotations"].update(
        {FINGERPRINT_ANNOTATION: hashlib_sha256(edited), BYTES_ANNOTATION: str(len(edited))}
    )
    with pytest.raises(StoreCorrupt, match="is not the result ConfigMap shardops-result-"):
        store.read_result(KEY)
    kube.delete(CONFIGMAPS, NAMESPACE, stored.name)
    with pytest.raises(StoreCorrupt, match="does not exist"):
        store.find_result(KEY, 5)
    kube.put(CONFIGMAPS, NAMESPACE, {"metadata": {"name": result_name(KEY)}, "data": {"x": "y"}})
    with pytest.raises(StoreCorrupt, match="is not a result pointer"):
        store.read_result(KEY)


def hashlib_sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


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


# --- results tied to the claim that computed them ------------------------------------------------


def _claim(token: int, owner: str = "worker-a") -> ResultMeta:
    return ResultMeta("camp", "camp-00000", owner, token, token)


def test_a_stale_claims_result_never_becomes_the_keys_result() -> None:
    """A holder frozen past its lease (token 1) stores its result after the live claim (token 2) took
    the shard over; the live claim stores a different result and completes. The key's result is the
    live claim's: a result becomes the key's only through the commit after its claim's Done write."""
    kube = FakeKube()
    store = ConfigMapStore(kube, NAMESPACE)  # type: ignore[arg-type]
    stale_text = encode_result(KEY, [(0, "k", "stale")])
    live_text = encode_result(KEY, [(0, "k", "live")])
    stale, reused = store.store_result(KEY, stale_text, _claim(1, "frozen"), 1)
    assert not reused and stale.text == stale_text
    assert store.read_result(KEY) is None, "stored by a claim, not committed: not the key's result"
    assert store.find_result(KEY, 1) == stale, "the claim's own result, for completing its zombie"
    assert store.find_result(KEY, 2) is None
    live, reused = store.store_result(KEY, live_text, _claim(2, "live"), 1)
    assert not reused and live.text == live_text, "never another claim's result"
    assert live.name != stale.name
    store.commit(KEY, live)  # after the live claim's fenced Done write
    committed = store.read_result(KEY)
    assert committed is not None and committed.text == live_text and committed.name == live.name
    assert store.find_result(KEY, 1) == committed, "once committed, the key's result, whoever asks"
    assert store.read_ref(stale.name, KEY).text == stale_text, "the stale object stays, pointed at by nothing"


def test_commit_is_create_once_and_a_later_commit_leaves_the_first() -> None:
    kube = FakeKube()
    store = ConfigMapStore(kube, NAMESPACE)  # type: ignore[arg-type]
    first, _ = store.store_result(KEY, encode_result(KEY, [(0, "k", 1)]), _claim(1), 1)
    store.commit(KEY, first)
    later, _ = store.store_result(KEY, encode_result(KEY, [(0, "k", 2)]), _claim(2), 1)
    assert later.name != first.name and later.text != first.text
    store.commit(KEY, later)
    store.commit(KEY, first)  # a retried commit
    assert store.read_result(KEY) == first
    assert store.read_ref(later.name, KEY) == later, "a Done shard naming it still reads it"


def test_a_retried_store_of_the_same_claim_returns_its_own_object() -> None:
    kube = FakeKube()
    store = ConfigMapStore(kube, NAMESPACE)  # type: ignore[arg-type]
    text = encode_result(KEY, [(0, "k", 1)])
    first, _ = store.store_result(KEY, text, _claim(3), 1)
    again, reused = store.store_result(KEY, encode_result(KEY, [(0, "k", 9)]), _claim(3), 1)
    assert not reused and again == first, "the create that met AlreadyExists keeps its own object"
    assert [name for _, _, name, _ in kube.write_log()] == [first.name, first.name]


def test_a_result_configmap_of_an_earlier_release_is_still_read() -> None:
    """Earlier releases stored the whole result in `shardops-result-<key label>`; users upgrade with
    those in place, and Done shards name them in status.result.ref."""
    kube = FakeKube()
    store = ConfigMapStore(kube, NAMESPACE)  # type: ignore[arg-type]
    name = "shardops-result-" + key_label(KEY)
    text = encode_result(KEY, [(0, "k", "from an earlier release")])
    legacy = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {"shardops.dev/idempotency-key": key_label(KEY), "shardops.dev/campaign": "camp"},
            "annotations": {
                FINGERPRINT_ANNOTATION: fingerprint(json.loads(text)),
                BYTES_ANNOTATION: str(len(text.encode())),
                "shardops.dev/idempotency-key": KEY,
                "shardops.dev/items": "1",
                "shardops.dev/shard": "camp-00000",
                "shardops.dev/owner": "old-worker",
                "shardops.dev/attempt": "1",
            },
        },
        "data": {"result.json": text},
    }
    kube.put(CONFIGMAPS, NAMESPACE, legacy)
    found = store.read_result(KEY)
    assert found is not None and found.text == text and found.name == name
    assert store.find_result(KEY, 4) == found
    assert store.read_ref(name, KEY) == found
    mine, _ = store.store_result(KEY, encode_result(KEY, [(0, "k", "new")]), _claim(4), 1)
    store.commit(KEY, mine)
    assert store.read_result(KEY) == found, "a result committed before stays"
