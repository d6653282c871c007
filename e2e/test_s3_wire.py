"""The thin S3 client (shardops.store.s3wire) against SeaweedFS: for every call the result store
makes, the same answers and errors as boto3 gives for the same objects."""

from __future__ import annotations

import gzip
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from testbed.cluster import lifecycle

from shardops.api.enums import StoreType
from shardops.api.store import ResultStoreStatus
from shardops.store.s3 import S3Store
from shardops.store.s3wire import Credentials, WireS3


def _wire(store: lifecycle.ObjectStore, secret: str | None = None, key_id: str | None = None) -> WireS3:
    return WireS3(
        store.endpoint,
        store.region,
        Credentials(key_id or store.access_key_id, secret or store.secret_access_key),
        sleep=lambda _: None,
    )


@pytest.fixture
def prefix() -> str:
    return f"e2e-wire/{uuid.uuid4().hex}/"


def _code(call: Any, **kwargs: Any) -> tuple[str, int]:
    with pytest.raises(ClientError) as failure:
        call(**kwargs)
    response = failure.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_objects_written_by_one_client_read_the_same_through_the_other(
    object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    wire, boto = _wire(object_store), object_store.client()
    bucket = object_store.bucket
    # Names that need encoding: a space, a plus, a non-ASCII letter.
    key = f"{prefix}attempts/k é+1/t3.json"
    body = '{"answer": "ü"}'.encode()
    wire.put_object(
        Bucket=bucket, Key=key, Body=body, ContentType="application/json",
        Metadata={"fingerprint": "ab12", "bytes": str(len(body))}, IfNoneMatch="*",
    )  # fmt: skip
    read = boto.get_object(Bucket=bucket, Key=key)
    assert read["Body"].read() == body and read["Metadata"] == {
        "fingerprint": "ab12",
        "bytes": str(len(body)),
    }
    assert read["ContentType"] == "application/json"

    other = f"{prefix}results/x.json"
    boto.put_object(Bucket=bucket, Key=other, Body=b"{}", Metadata={"campaign": "c"})
    mine = wire.get_object(Bucket=bucket, Key=other)
    assert (
        mine["Body"].read() == b"{}" and mine["Metadata"] == {"campaign": "c"} and mine["ContentLength"] == 2
    )
    assert wire.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(body)


def test_a_conditional_put_never_replaces_and_fails_as_boto3s_does(
    object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    wire, boto = _wire(object_store), object_store.client()
    bucket, key = object_store.bucket, f"{prefix}once.json"
    wire.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
    ours = _code(wire.put_object, Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
    theirs = _code(boto.put_object, Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert ours == theirs and ours[1] == 412
    assert boto.get_object(Bucket=bucket, Key=key)["Body"].read() == b"first"


def test_missing_things_fail_with_boto3s_codes(object_store: lifecycle.ObjectStore, prefix: str) -> None:
    wire, boto = _wire(object_store), object_store.client()
    bucket = object_store.bucket
    for call in ("get_object", "head_object"):
        ours = _code(getattr(wire, call), Bucket=bucket, Key=f"{prefix}none")
        assert ours == _code(getattr(boto, call), Bucket=bucket, Key=f"{prefix}none"), call
    assert _code(wire.head_bucket, Bucket="no-such-bucket-wire") == ("404", 404)
    ours = _code(wire.list_objects_v2, Bucket="no-such-bucket-wire", Prefix="")
    assert (
        ours == _code(boto.list_objects_v2, Bucket="no-such-bucket-wire", Prefix="")
        and ours[0] == "NoSuchBucket"
    )


def test_wrong_keys_are_refused_by_name(object_store: lifecycle.ObjectStore) -> None:
    bucket = object_store.bucket
    wrong_secret = _wire(object_store, secret="not-the-secret")
    assert _code(wrong_secret.list_objects_v2, Bucket=bucket, Prefix="")[0] == "SignatureDoesNotMatch"
    unknown = _wire(object_store, key_id="AKIDUNKNOWN0000")
    assert _code(unknown.list_objects_v2, Bucket=bucket, Prefix="")[0] == "InvalidAccessKeyId"


def test_listing_pages_in_key_order_and_deleting_a_prefix(
    object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    wire = _wire(object_store)
    bucket = object_store.bucket
    names = [f"{prefix}items/t1-{i:06d}.jsonl" for i in range(5)]
    for name in reversed(names):
        wire.put_object(Bucket=bucket, Key=name, Body=b"{}\n")
    pages, token = [], None
    while True:
        page = wire.list_objects_v2(
            Bucket=bucket, Prefix=f"{prefix}items/", ContinuationToken=token, MaxKeys=2
        )
        pages.append([entry["Key"] for entry in page["Contents"]])
        token = page.get("NextContinuationToken")
        if not page["IsTruncated"]:
            break
    assert pages == [names[0:2], names[2:4], names[4:5]]
    store = S3Store(
        ResultStoreStatus(type=StoreType.S3, bucket=bucket, endpoint=object_store.endpoint), "ns", client=wire
    )
    assert store.delete_prefix(prefix) == 5
    assert list(store.names(prefix)) == []


def test_a_gzip_object_streams_line_by_line_through_the_store(
    object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    wire = _wire(object_store)
    lines = [f'{{"n": {i}}}\n' for i in range(2000)]
    key = f"{prefix}inputs/items.jsonl.gz"
    object_store.client().put_object(
        Bucket=object_store.bucket, Key=key, Body=gzip.compress("".join(lines).encode())
    )
    store = S3Store(ResultStoreStatus(type=StoreType.S3, bucket=object_store.bucket), "ns", client=wire)
    assert list(store.open_lines(key)) == lines


def test_a_plain_jsonl_object_streams_to_its_last_line(
    object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    wire = _wire(object_store)
    lines = [f'{{"n": {i}, "text": "ü"}}\n' for i in range(500)]
    key = f"{prefix}inputs/items.jsonl"
    wire.put_object(Bucket=object_store.bucket, Key=key, Body="".join(lines).encode())
    store = S3Store(ResultStoreStatus(type=StoreType.S3, bucket=object_store.bucket), "ns", client=wire)
    assert list(store.open_lines(key)) == lines
    assert list(store.open_lines(key)) == lines, "read again on the same pool"


def test_nothing_listening_is_an_endpoint_error(object_store: lifecycle.ObjectStore) -> None:
    from testbed.cluster.lifecycle import free_port

    closed = WireS3(
        f"http://127.0.0.1:{free_port()}", object_store.region, Credentials("a", "b"), sleep=lambda _: None
    )
    with pytest.raises(EndpointConnectionError):
        closed.head_bucket(Bucket=object_store.bucket)
