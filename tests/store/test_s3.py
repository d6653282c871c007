"""The S3 result store against an in-memory S3 (unit level; e2e runs it against SeaweedFS):
object layout, write-once, the commit that makes a result reusable, resume chunks, and errors that
name their fix."""

from __future__ import annotations

import io
import json

import pytest

from shardops.api.enums import StoreType
from shardops.api.items import MAX_ITEMS_OBJECT_BYTES
from shardops.api.store import ResultStoreSpec, ResultStoreStatus, S3Location, resolve_result_store
from shardops.store import capacity_problem
from shardops.store.lines import NotJsonlText
from shardops.store.records import (
    ItemRecord,
    ResultMeta,
    ResultTooLarge,
    StoreCorrupt,
    StoreUnavailable,
    encode_result,
)
from shardops.store.s3 import UPLOAD_PART_BYTES, UPLOAD_PARTS_IN_FLIGHT, S3Store
from tests.fakes3 import FakeS3

KEY = "sha256:" + "ab" * 32
LOCATION = ResultStoreStatus(type=StoreType.S3, endpoint="http://127.0.0.1:1", bucket="results", prefix="p")


@pytest.fixture
def s3() -> FakeS3:
    return FakeS3()


@pytest.fixture
def store(s3: FakeS3) -> S3Store:
    return S3Store(LOCATION, "ns", client=s3)


def _meta(token: int) -> ResultMeta:
    return ResultMeta("camp", "camp-00000", f"worker-{token}", 1, token)


def _text() -> str:
    return encode_result(KEY, [(0, "sub-a", {"answer": 1}), (1, "sub-b", {"answer": 2})])


def test_a_claims_result_is_its_own_object_and_becomes_the_keys_only_when_committed(store: S3Store) -> None:
    stored, reused = store.store_result(KEY, _text(), _meta(7), 2)
    assert not reused
    assert stored.name == "p/ns/attempts/" + store.attempt_name(KEY, 7).split("/attempts/")[1]
    assert stored.name.endswith("/t7.json")
    # Written but not committed (the Done write may still be refused): not the key's result yet.
    assert store.read_result(KEY) is None
    store.commit(KEY, stored)
    found = store.read_result(KEY)
    assert found is not None and (found.name, found.fingerprint, found.bytes) == (
        stored.name,
        stored.fingerprint,
        stored.bytes,
    )
    assert store.read_ref(stored.name, KEY).text == _text()


def test_a_second_commit_keeps_the_first_result(store: S3Store) -> None:
    first, _ = store.store_result(KEY, _text(), _meta(1), 2)
    store.commit(KEY, first)
    later, _ = store.store_result(KEY, _text(), _meta(2), 2)
    store.commit(KEY, later)
    found = store.read_result(KEY)
    assert found is not None and found.name == first.name


def test_objects_are_never_overwritten(store: S3Store, s3: FakeS3) -> None:
    stored, _ = store.store_result(KEY, _text(), _meta(3), 2)
    before = s3.objects[stored.name]
    again, _ = store.store_result(KEY, _text(), _meta(3), 2)
    assert s3.objects[stored.name] is before and again.fingerprint == stored.fingerprint


def test_an_edited_object_does_not_verify(store: S3Store, s3: FakeS3) -> None:
    stored, _ = store.store_result(KEY, _text(), _meta(4), 2)
    store.commit(KEY, stored)
    body, metadata = s3.objects[stored.name]
    s3.objects[stored.name] = (body.replace(b"1", b"9"), metadata)
    with pytest.raises(StoreCorrupt, match="fingerprint"):
        store.read_result(KEY)


def test_item_chunks_of_every_attempt_are_read_back_for_resuming(store: S3Store, s3: FakeS3) -> None:
    assert store.save_items(KEY, "camp", {"a": ItemRecord({"v": 1}, 0.5)}, "camp-00000", token=1) == 1
    store.save_items(KEY, "camp", {"b": ItemRecord({"v": 2})}, "camp-00000", token=1)
    store.save_items(KEY, "camp", {"c": ItemRecord({"v": 3})}, "camp-00000", token=2)
    chunks = sorted(k for k in s3.objects if "/items/" in k)
    assert [c.rsplit("/", 1)[1] for c in chunks] == ["t1-000001.jsonl", "t1-000002.jsonl", "t2-000001.jsonl"]
    found, corrupt = store.read_items(KEY, ["a", "b", "c", "d"])
    assert found == {"a": ItemRecord({"v": 1}, 0.5), "b": ItemRecord({"v": 2}), "c": ItemRecord({"v": 3})}
    assert corrupt == []


def test_a_corrupt_item_line_is_recomputed_not_trusted(store: S3Store, s3: FakeS3) -> None:
    store.save_items(KEY, "camp", {"a": ItemRecord({"v": 1})}, "camp-00000", token=1)
    (name,) = [k for k in s3.objects if "/items/" in k]
    line = json.loads(s3.objects[name][0])
    line["result"] = {"v": 666}
    s3.objects[name] = (json.dumps(line).encode(), {})
    found, corrupt = store.read_items(KEY, ["a"])
    assert found == {} and corrupt == ["a"]


def test_a_result_over_the_cap_writes_nothing(s3: FakeS3) -> None:
    small = S3Store(LOCATION, "ns", client=s3, max_bytes=10)
    with pytest.raises(ResultTooLarge, match="SHARDOPS_RESULT_MAX_BYTES"):
        small.store_result(KEY, _text(), _meta(1), 2)
    assert s3.objects == {}


def test_an_unreachable_store_names_the_endpoint(store: S3Store, s3: FakeS3) -> None:
    s3.down = True
    with pytest.raises(StoreUnavailable, match="endpoint"):
        store.read_result(KEY)


def test_a_wrong_region_is_named_with_its_fix(store: S3Store, s3: FakeS3) -> None:
    # The thin client does not follow S3's region redirect: the store's answer must say what to set.
    from botocore.exceptions import ClientError

    def redirected(**_: object) -> None:
        raise ClientError({"Error": {"Code": "AuthorizationHeaderMalformed"}}, "GetObject")

    s3.get_object = redirected  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable, match=r"set spec\.resultStore\.s3\.region"):
        store.read_result(KEY)


def test_a_missing_bucket_is_named_with_its_fix(s3: FakeS3) -> None:
    other = S3Store(LOCATION.model_copy(update={"bucket": "nope"}), "ns", client=s3)
    with pytest.raises(StoreUnavailable, match="NoSuchBucket: the bucket does not exist"):
        other.probe()
    with pytest.raises(StoreUnavailable, match="NoSuchBucket"):
        other.read_result(KEY)


def test_campaign_settings_override_the_installations_field_by_field() -> None:
    installation = ResultStoreStatus(
        type=StoreType.CONFIG_MAP, endpoint="http://s3:8333", bucket="inst", credentials_secret="creds"
    )
    assert resolve_result_store(None, installation) == ResultStoreStatus(type=StoreType.CONFIG_MAP)
    chosen = resolve_result_store(
        ResultStoreSpec(
            type=StoreType.S3, s3=S3Location(bucket="mine", prefix="", credentials_secret="mine-keys")
        ),
        installation,
    )
    assert chosen == ResultStoreStatus(
        type=StoreType.S3, endpoint="http://s3:8333", bucket="mine", prefix="", credentials_secret="mine-keys"
    )


def test_the_configmap_store_refuses_campaigns_over_its_ceiling() -> None:
    configmap = ResultStoreStatus(type=StoreType.CONFIG_MAP)
    assert capacity_problem(configmap, 1000) is None
    problem = capacity_problem(configmap, 1001)
    assert problem is not None and "configure object storage" in problem and "1001 work shards" in problem
    assert capacity_problem(ResultStoreStatus(type=StoreType.S3, bucket="b"), 10**6) is None
    assert "no bucket" in (capacity_problem(ResultStoreStatus(type=StoreType.S3), 1) or "")


@pytest.mark.parametrize(
    ("key", "body"),
    [("in/latin1.jsonl", '{"name": "café"}\n'.encode("latin-1")), ("in/plain.jsonl.gz", b'{"n": 1}\n')],
)
def test_an_object_that_is_not_utf8_jsonl_or_not_its_gzip_is_named_with_the_fix(
    store: S3Store, s3: FakeS3, key: str, body: bytes
) -> None:
    s3.objects[key] = (body, {})
    with pytest.raises(NotJsonlText, match=r"is not JSONL text .* upload it as UTF-8 JSONL, gzip-compressed"):
        list(store.open_lines(key))


def test_uploads_hold_a_bounded_number_of_parts_in_memory(store: S3Store, s3: FakeS3) -> None:
    """boto3's defaults read up to 10 parts of 8 MiB ahead; every upload_fileobj gets the bounded config."""
    assert store.upload_once("p/ns/inputs/x/a.jsonl", io.BytesIO(b"{}\n"), "application/x-ndjson")
    (config,) = s3.transfer_configs
    assert config.multipart_chunksize == UPLOAD_PART_BYTES == 8 * 2**20
    assert config.max_request_concurrency == UPLOAD_PARTS_IN_FLIGHT == 2
    assert config.max_in_memory_upload_chunks == UPLOAD_PARTS_IN_FLIGHT
    assert UPLOAD_PART_BYTES * 10_000 > MAX_ITEMS_OBJECT_BYTES, "S3's 10,000 parts hold the largest file"
