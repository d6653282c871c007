"""The S3 store through boto3 (the local control plane's SeaweedFS, or the one SHARDOPS_S3_* names):
the primitives the result store builds on — a write that never replaces an object, compare-and-swap,
listing by prefix, streamed reads of large objects, errors a caller can name, and a server restart
that keeps the data."""

from __future__ import annotations

import gzip
import json
import random
import threading
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError
from testbed.cluster import lifecycle
from testbed.harness import Cluster, wait_for


@pytest.fixture
def s3(object_store: lifecycle.ObjectStore) -> Any:
    return object_store.client()


@pytest.fixture
def prefix() -> str:
    """Every test writes under its own prefix: the bucket is shared by the session."""
    return f"e2e/{uuid.uuid4().hex}/"


def _error(call: Any, **kwargs: Any) -> tuple[str, int]:
    """The S3 error code and HTTP status a call fails with."""
    with pytest.raises(ClientError) as failure:
        call(**kwargs)
    response = failure.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def _body(s3: Any, bucket: str, key: str) -> bytes:
    data: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return data


def test_put_then_get_returns_the_same_bytes(
    s3: Any, object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    key = prefix + "result.json"
    body = json.dumps({"index": 7, "result": "ü" * 1000}).encode()
    put = s3.put_object(Bucket=object_store.bucket, Key=key, Body=body, ContentType="application/json")
    assert _body(s3, object_store.bucket, key) == body
    head = s3.head_object(Bucket=object_store.bucket, Key=key)
    assert head["ContentLength"] == len(body)
    assert head["ETag"] == put["ETag"]
    assert head["ContentType"] == "application/json"


def test_conditional_put_never_replaces_an_object(
    s3: Any, object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    """If-None-Match: * — the primitive behind "a result, once written, is never overwritten"."""
    key = prefix + "once"
    s3.put_object(Bucket=object_store.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    assert _error(s3.put_object, Bucket=object_store.bucket, Key=key, Body=b"second", IfNoneMatch="*") == (
        "PreconditionFailed",
        412,
    )
    assert _body(s3, object_store.bucket, key) == b"first"


def _race(s3: Any, bucket: str, key: str, writers: int) -> dict[int, str]:
    """`writers` threads put the same key with If-None-Match: * at once; what each one got."""
    start = threading.Barrier(writers)
    outcomes: dict[int, str] = {}

    def write(writer: int) -> None:
        start.wait()
        try:
            s3.put_object(Bucket=bucket, Key=key, Body=f"writer {writer}".encode(), IfNoneMatch="*")
            outcomes[writer] = "written"
        except ClientError as error:
            outcomes[writer] = error.response["Error"]["Code"]

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_exactly_one_of_concurrent_conditional_puts_wins(
    object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    writers = 8
    s3 = object_store.client(
        config=Config(
            s3={"addressing_style": "path"}, max_pool_connections=writers, retries={"max_attempts": 1}
        )
    )
    for round_ in range(5):
        key = f"{prefix}race-{round_}"
        outcomes = _race(s3, object_store.bucket, key, writers)
        winners = [writer for writer, outcome in outcomes.items() if outcome == "written"]
        assert len(winners) == 1, outcomes
        # AWS S3 may also answer a concurrent conditional write with 409 ConditionalRequestConflict.
        assert set(outcomes.values()) - {"written"} <= {"PreconditionFailed", "ConditionalRequestConflict"}
        assert _body(s3, object_store.bucket, key) == f"writer {winners[0]}".encode()


def test_if_match_writes_only_over_the_version_read(
    s3: Any, object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    """If-Match: <ETag> — compare-and-swap on an object, what an append-only ledger needs."""
    key = prefix + "ledger"
    first = s3.put_object(Bucket=object_store.bucket, Key=key, Body=b"v1")["ETag"]
    second = s3.put_object(Bucket=object_store.bucket, Key=key, Body=b"v2", IfMatch=first)["ETag"]
    assert second != first
    assert _error(s3.put_object, Bucket=object_store.bucket, Key=key, Body=b"v3", IfMatch=first) == (
        "PreconditionFailed",
        412,
    )
    assert _body(s3, object_store.bucket, key) == b"v2"
    # On a key that does not exist, If-Match is NoSuchKey (as on AWS), not a created object.
    missing = prefix + "missing"
    assert _error(s3.put_object, Bucket=object_store.bucket, Key=missing, Body=b"x", IfMatch=first) == (
        "NoSuchKey",
        404,
    )
    assert _error(s3.head_object, Bucket=object_store.bucket, Key=missing)[1] == 404


def test_list_objects_v2_by_prefix_pages_in_key_order(
    s3: Any, object_store: lifecycle.ObjectStore, prefix: str
) -> None:
    names = ["a/1", "a/2", "a/3", "a/4", "a/5", "ab/1", "b/1"]
    for name in reversed(names):
        s3.put_object(Bucket=object_store.bucket, Key=prefix + name, Body=name.encode())

    pages: list[list[str]] = []
    arguments: dict[str, Any] = {"Bucket": object_store.bucket, "Prefix": prefix + "a/", "MaxKeys": 2}
    while True:
        page = s3.list_objects_v2(**arguments)
        pages.append([item["Key"].removeprefix(prefix) for item in page.get("Contents", [])])
        if not page["IsTruncated"]:
            break
        arguments["ContinuationToken"] = page["NextContinuationToken"]
    assert pages == [["a/1", "a/2"], ["a/3", "a/4"], ["a/5"]]

    after = s3.list_objects_v2(Bucket=object_store.bucket, Prefix=prefix + "a/", StartAfter=prefix + "a/3")
    assert [item["Key"].removeprefix(prefix) for item in after["Contents"]] == ["a/4", "a/5"]
    # A prefix is a string prefix, not a directory: "a" also matches "ab/1".
    loose = s3.list_objects_v2(Bucket=object_store.bucket, Prefix=prefix + "a")
    assert [item["Key"].removeprefix(prefix) for item in loose["Contents"]] == names[:6]
    folders = s3.list_objects_v2(Bucket=object_store.bucket, Prefix=prefix, Delimiter="/")
    assert [p["Prefix"].removeprefix(prefix) for p in folders["CommonPrefixes"]] == ["a/", "ab/", "b/"]
    empty = s3.list_objects_v2(Bucket=object_store.bucket, Prefix=prefix + "none/")
    assert empty["KeyCount"] == 0 and "Contents" not in empty


def _jsonl_lines(count: int) -> Iterator[bytes]:
    rng = random.Random(11)
    for index in range(count):
        # Random payloads, so that gzip cannot shrink the object to nothing.
        yield (
            json.dumps({"index": index, "key": f"item-{index}", "payload": rng.randbytes(24).hex()}).encode()
            + b"\n"
        )


def test_gzip_jsonl_object_streams_line_by_line(
    s3: Any, object_store: lifecycle.ObjectStore, prefix: str, tmp_path: Path
) -> None:
    lines = 120_000
    source = tmp_path / "items.jsonl.gz"
    with gzip.open(source, "wb") as out:
        for line in _jsonl_lines(lines):
            out.write(line)
    size = source.stat().st_size
    assert size > 4 * 2**20, size
    key = prefix + "items.jsonl.gz"
    # Parts of 2 MiB: the upload is a multipart upload.
    parts = TransferConfig(multipart_threshold=2 * 2**20, multipart_chunksize=2 * 2**20)
    s3.upload_file(str(source), object_store.bucket, key, Config=parts)
    assert s3.head_object(Bucket=object_store.bucket, Key=key)["ContentLength"] == size

    tracemalloc.start()
    try:
        seen = 0
        with gzip.open(
            s3.get_object(Bucket=object_store.bucket, Key=key)["Body"], "rt", encoding="utf-8"
        ) as items:
            for number, line in enumerate(items):
                item = json.loads(line)
                assert item["index"] == number and item["key"] == f"item-{number}"
                seen += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == lines
    # Read as a stream: never more than a small part of the object in memory at once.
    assert peak < size / 8, f"peak {peak} bytes while reading a {size}-byte object"

    # A ranged GET returns exactly that slice: a reader can resume where a connection broke.
    start, end = size // 3, size // 3 + 65_535
    ranged = s3.get_object(Bucket=object_store.bucket, Key=key, Range=f"bytes={start}-{end}")
    assert ranged["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert ranged["ContentRange"] == f"bytes {start}-{end}/{size}"
    with source.open("rb") as original:
        original.seek(start)
        assert ranged["Body"].read() == original.read(end - start + 1)


@pytest.mark.parametrize(
    ("wrong", "expected"),
    [
        ({"aws_secret_access_key": "not-the-secret"}, ("SignatureDoesNotMatch", 403)),
        ({"aws_access_key_id": "SHARDOPSUNKNOWNKEY00"}, ("InvalidAccessKeyId", 403)),
    ],
    ids=["wrong-secret", "unknown-access-key"],
)
def test_wrong_credentials_fail_with_a_named_error(
    object_store: lifecycle.ObjectStore, prefix: str, wrong: dict[str, str], expected: tuple[str, int]
) -> None:
    s3 = object_store.client(**wrong)
    assert _error(s3.put_object, Bucket=object_store.bucket, Key=prefix + "x", Body=b"x") == expected
    assert _error(s3.head_bucket, Bucket=object_store.bucket)[1] == 403


def test_restart_keeps_objects_and_the_write_once_rule(
    local_cluster: Cluster, object_store: lifecycle.ObjectStore, s3: Any, prefix: str
) -> None:
    local = local_cluster.local
    assert local is not None
    key = prefix + "survivor"
    s3.put_object(Bucket=object_store.bucket, Key=key, Body=b"kept", IfNoneMatch="*")
    before = local.processes["seaweedfs"].pid

    local.restart_object_store()

    assert local.processes["seaweedfs"].pid != before
    assert local.object_store == object_store  # same endpoint and credentials
    # The client made before the restart carries on: its dropped connections are reopened.
    assert _body(s3, object_store.bucket, key) == b"kept"
    assert _error(s3.put_object, Bucket=object_store.bucket, Key=key, Body=b"new", IfNoneMatch="*") == (
        "PreconditionFailed",
        412,
    )


def _listening_sockets(pid: int) -> set[tuple[str, str, int]]:
    """(protocol, address, port) of every socket the process listens on (TCP) or is bound to (UDP)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = str(fd.readlink()) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for protocol in ("tcp", "tcp6", "udp", "udp6"):
        for row in Path(f"/proc/net/{protocol}").read_text().splitlines()[1:]:
            fields = row.split()
            local_address, state, inode = fields[1], fields[3], fields[9]
            listening = state == "0A" if protocol.startswith("tcp") else True
            if inode in inodes and listening:
                hex_address, hex_port = local_address.split(":")
                if len(hex_address) == 8:  # IPv4, little-endian
                    address = ".".join(str(int(hex_address[i : i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    address = hex_address
                found.add((protocol, address, int(hex_port, 16)))
    return found


def test_seaweedfs_listens_only_on_the_loopback_ports_it_was_given(local_cluster: Cluster) -> None:
    local = local_cluster.local
    assert local is not None
    pid = local.processes["seaweedfs"].pid
    given = {("tcp", "127.0.0.1", port): flag for flag, port in local.seaweedfs_ports.items()}
    missing: list[str] = []

    def all_given_and_nothing_else() -> bool:
        sockets = _listening_sockets(pid)
        assert sockets <= given.keys(), (
            f"SeaweedFS listens where it was not told to: {sockets - given.keys()}"
        )
        missing[:] = [flag for socket, flag in given.items() if socket not in sockets]
        return not missing

    # Its admin server starts last, after the S3 gateway the cluster waits for.
    try:
        wait_for("SeaweedFS to listen on every port it was given", all_given_and_nothing_else, timeout=30)
    except AssertionError as error:
        raise AssertionError(f"{error}; not listening: {missing}") from None
