"""The S3 result store: results as objects in a bucket (AWS S3, GCS interoperability, Ceph RGW, R2,
SeaweedFS, ...), through the thin client of `s3wire` when the keys are static, else boto3.

Layout under `<prefix>/<namespace>/`, keyed by the shard's idempotency key (its label form):

* `attempts/<key>/t<token>.json`: the result document one claim computed, written once
  (`If-None-Match: *`) with its SHA-256 and length as object metadata. The token is the claim's
  Lease fencing token, so two claims never write the same object.
* `results/<key>.json`: the key's committed result, a small pointer {ref, fingerprint, bytes} to
  one attempt object, written once (`If-None-Match: *`) and only after the fenced Done write of
  that claim succeeded. A stale holder (its Lease taken over while it was frozen) can write its
  attempt object, but its Done write is refused, so nothing ever points at that object: it never
  becomes a result. Reuse on re-apply reads the pointer and verifies the object it names.
* `items/<key>/t<token>-<seq>.jsonl`: the item results one claim flushed at a heartbeat (one
  line per item), read back by the next attempt to resume. Never overwritten.
* `ledger/<campaign>-<uid>/<sequence>-<random>.jsonl`: the facts of the Done shards one fold of
  the operator recorded before deleting their Shard objects (`state.ledger.record`), one line per
  shard. Readers keep the first line per shard index among the indices `status.folded` counts.

Nothing is ever replaced: objects are immutable once written. Errors of the store (unreachable,
no bucket, credentials refused) raise `StoreUnavailable` naming what to fix.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardops.api.enums import ConditionReason, StoreType
from shardops.api.items import MAX_ITEMS_OBJECT_BYTES
from shardops.api.store import ResultStoreStatus
from shardops.k8s.campaigns import ItemsUnavailable
from shardops.logic.idempotency import canonical_json
from shardops.store.lines import ItemsChanged, object_lines
from shardops.store.records import (
    ItemRecord,
    ResultMeta,
    StoreCorrupt,
    StoredResult,
    StoreUnavailable,
    check_document,
    check_size,
    decode_item,
    encode_pointer,
    follow_pointer,
    sha256_of,
    store_label,
)
from shardops.store.s3wire import DEFAULT_REGION as REGION
from shardops.store.s3wire import Credentials, WireS3

log = logging.getLogger(__name__)

# Large enough for any shard of LLM outputs (a worker holds one result in memory while storing it);
# SHARDOPS_RESULT_MAX_BYTES lowers or raises it.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
CAP_FIX = "SHARDOPS_RESULT_MAX_BYTES of the worker"
FINGERPRINT_META = "fingerprint"
BYTES_META = "bytes"
_REGION_FIX = "the bucket is in another region: set spec.resultStore.s3.region to the bucket's region"
# Error codes that no retry fixes: the campaign's store settings (or the Secret) must change.
_CONFIGURATION_CODES = {
    "NoSuchBucket": "the bucket does not exist: create it, or set spec.resultStore.s3.bucket",
    "AccessDenied": "the credentials may not use this bucket: check the credentials Secret and its policy",
    "InvalidAccessKeyId": "the access key is unknown to the store: check the credentials Secret",
    "SignatureDoesNotMatch": "the secret key is wrong: check the credentials Secret",
    "AllAccessDisabled": "the bucket refuses all access: check the bucket's policy",
    # The thin client does not follow S3's region redirect as boto3 does: the region must be right.
    "AuthorizationHeaderMalformed": _REGION_FIX,
    "PermanentRedirect": _REGION_FIX,
}
# HeadBucket answers without a body, so only the HTTP status names the problem.
_BUCKET_PROBE_CODES = {
    "404": _CONFIGURATION_CODES["NoSuchBucket"],
    "403": _CONFIGURATION_CODES["AccessDenied"],
}
_PRECONDITION_CODES = {"PreconditionFailed", "412"}
# AWS answers a conditional write racing another with 409; it is retried like a transient error.
_CONFLICT_CODES = {"ConditionalRequestConflict", "409"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_EXPECTED_CODES = frozenset(_PRECONDITION_CODES | _MISSING_CODES)


@dataclass
class OpenedItems:
    """An object of items being read: its lines (streamed) and the ETag of the version read."""

    lines: Iterator[str]
    etag: str | None


def _closing(body: Any, lines: Iterator[str]) -> Iterator[str]:
    """`lines`, closing the object's body when they end, fail or are dropped."""
    try:
        yield from lines
    finally:
        body.close()


def client_for(location: ResultStoreStatus, credentials: Mapping[str, str] | None = None) -> Any:
    """An S3 client for `location`. With static keys (`credentials`, the keys of a credentials
    Secret, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment, as the workers get
    them from that Secret) the thin client of `s3wire`; otherwise boto3, whose default chain finds
    them (a profile, workload identity on a cloud)."""
    keys = credentials if credentials is not None else os.environ
    access_key, secret_key = keys.get("AWS_ACCESS_KEY_ID"), keys.get("AWS_SECRET_ACCESS_KEY")
    if not (access_key and secret_key):
        return boto3_client_for(location, credentials)
    return WireS3(
        location.endpoint,
        location.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or REGION,
        Credentials(access_key, secret_key, keys.get("AWS_SESSION_TOKEN") or None),
        ca_bundle=os.environ.get("AWS_CA_BUNDLE") or None,
        fallback=lambda: boto3_client_for(location, credentials),
    )


# boto3's managed upload (an items file, a Batch API upload) reads each part into memory before it
# sends it. Its defaults let 10 parts of 8 MiB wait in memory (80 MiB) besides the one being read;
# this lets 2 (so 3 parts, 24 MiB, whatever the file's size; the Batch API service measured +42 MiB
# of peak RSS for a 110 MiB upload, check included, as for a 55 MiB one). 8 MiB parts: S3 takes at
# most 10,000 parts, so 78 GiB, over MAX_ITEMS_OBJECT_BYTES.
UPLOAD_PART_BYTES = 8 * 2**20
UPLOAD_PARTS_IN_FLIGHT = 2


def upload_transfer() -> Any:
    """The TransferConfig of every `upload_fileobj`: parts of UPLOAD_PART_BYTES, at most
    UPLOAD_PARTS_IN_FLIGHT read and sent at once."""
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(
        multipart_threshold=UPLOAD_PART_BYTES,
        multipart_chunksize=UPLOAD_PART_BYTES,
        max_concurrency=UPLOAD_PARTS_IN_FLIGHT,
        # The classic transfer manager, whose memory these figures bound (not the CRT client's).
        preferred_transfer_client="classic",
    )
    # The parts read ahead of their upload (s3transfer's own setting; boto3's constructor lacks it).
    config.max_in_memory_upload_chunks = UPLOAD_PARTS_IN_FLIGHT
    return config


def boto3_client_for(location: ResultStoreStatus, credentials: Mapping[str, str] | None = None) -> Any:
    """A boto3 S3 client for `location`; credentials from the default chain unless `credentials`
    (the keys of a credentials Secret) are given."""
    import boto3
    from botocore.config import Config

    arguments: dict[str, Any] = {
        "config": Config(
            # Path-style addressing for endpoints without per-bucket host names (on-premises, loopback).
            s3={"addressing_style": "path" if location.endpoint else "auto"},
            connect_timeout=5,
            read_timeout=30,
            retries={"mode": "standard", "max_attempts": 4},
        )
    }
    if location.endpoint:
        arguments["endpoint_url"] = location.endpoint
    if location.region:
        arguments["region_name"] = location.region
    if credentials:
        arguments["aws_access_key_id"] = credentials.get("AWS_ACCESS_KEY_ID")
        arguments["aws_secret_access_key"] = credentials.get("AWS_SECRET_ACCESS_KEY")
    return boto3.client("s3", **arguments)


def _code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str((response.get("Error") or {}).get("Code") or "")


@dataclass
class S3Store:
    """One campaign's S3 store for one namespace: the `ResultStore` the worker and the CLI use."""

    location: ResultStoreStatus
    namespace: str
    client: Any = None
    max_bytes: int = DEFAULT_MAX_BYTES
    # Flushes of item results per (key, token): names the next chunk of a claim.
    _chunks: dict[tuple[str, int], int] = field(default_factory=dict)

    type = StoreType.S3

    def __post_init__(self) -> None:
        if self.client is None:
            self.client = client_for(self.location)

    @property
    def bucket(self) -> str:
        if not self.location.bucket:
            raise StoreUnavailable(
                "no bucket is configured for the S3 result store: set spec.resultStore.s3.bucket "
                "or the installation's resultStore.s3.bucket"
            )
        return self.location.bucket

    def describe(self) -> str:
        where = self.location.endpoint or "AWS S3"
        return f"s3://{self.location.bucket}/{self._root()} at {where}"

    # --- names -------------------------------------------------------------------------------------

    def _root(self) -> str:
        return self.location.area(self.namespace)

    def attempts_prefix(self, key: str) -> str:
        return f"{self._root()}attempts/{store_label(key)}/"

    def attempt_name(self, key: str, token: int) -> str:
        return f"{self.attempts_prefix(key)}t{token}.json"

    def pointers_prefix(self) -> str:
        return f"{self._root()}results/"

    def pointer_name(self, key: str) -> str:
        return f"{self.pointers_prefix()}{store_label(key)}.json"

    def items_prefix(self, key: str) -> str:
        return f"{self._root()}items/{store_label(key)}/"

    # --- calls -------------------------------------------------------------------------------------

    def _call(
        self, what: str, method: str, expected: frozenset[str] = _EXPECTED_CODES, **arguments: Any
    ) -> Any:
        """One S3 call; StoreUnavailable (naming the fix) for anything but the `expected` answers
        (a missing object, a failed precondition), which the caller handles."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, method)(**{"Bucket": self.bucket, **arguments})
        except ClientError as error:
            code = _code(error)
            if code in expected:
                raise
            fix = _CONFIGURATION_CODES.get(code, "the store answered an error; it is retried")
            raise StoreUnavailable(
                f"S3 {what} in {self.describe()} failed with {code or error}: {fix}"
            ) from error
        except BotoCoreError as error:
            raise StoreUnavailable(
                f"S3 {what} in {self.describe()} failed: {error} (is the endpoint reachable? "
                "spec.resultStore.s3.endpoint); it is retried"
            ) from error

    def _get(self, name: str) -> tuple[bytes, Mapping[str, str]] | None:
        from botocore.exceptions import ClientError

        try:
            answer = self._call(f"GET {name}", "get_object", Key=name)
        except ClientError as error:
            if _code(error) in _MISSING_CODES:
                return None
            raise
        body: bytes = answer["Body"].read()
        return body, dict(answer.get("Metadata") or {})

    def _put_once(self, name: str, body: bytes, metadata: Mapping[str, str], content_type: str) -> bool:
        """Write `name` unless it exists; False when it already did (the existing one is kept)."""
        from botocore.exceptions import ClientError

        for _ in range(3):
            try:
                self._call(
                    f"PUT {name}",
                    "put_object",
                    Key=name,
                    Body=body,
                    ContentType=content_type,
                    Metadata=dict(metadata),
                    IfNoneMatch="*",
                )
                return True
            except ClientError as error:
                if _code(error) in _PRECONDITION_CODES:
                    return False
                if _code(error) in _CONFLICT_CODES:
                    continue
                raise
        return False

    def names(self, prefix: str) -> Iterator[str]:
        """Every object name under `prefix`, 1,000 per request (callers say what bounds the prefix)."""
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[str]:
        token: str | None = None
        while True:
            arguments: dict[str, Any] = {"Prefix": prefix}
            if token:
                arguments["ContinuationToken"] = token
            page = self._call(f"LIST {prefix}", "list_objects_v2", **arguments)
            for entry in page.get("Contents") or []:
                yield str(entry["Key"])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def open_lines(self, key: str, bucket: str | None = None) -> Iterator[str]:
        """The lines of an object (`open_items`), without their newlines."""
        return self.open_items(key, bucket).lines

    def open_items(self, key: str, bucket: str | None = None, if_match: str | None = None) -> OpenedItems:
        """An object of items, its lines streamed with bounded memory (store.lines: gzip-inflated
        when its key ends in .gz or it says Content-Encoding gzip), and its ETag. With `if_match`,
        only that version: ItemsChanged when the object is another now. ItemsUnavailable names the
        field and the fix when it is missing or too large; the lines raise ItemsOverLimit past a
        bound, NotJsonlText when not text or not gzip."""
        from botocore.exceptions import ClientError

        where = f"s3://{bucket or self.bucket}/{key}"
        try:
            extra: dict[str, Any] = {"Bucket": bucket} if bucket else {}
            if if_match:
                extra["IfMatch"] = if_match
            answer = self._call(f"GET {key}", "get_object", Key=key, **extra)
        except ClientError as error:
            if _code(error) in _MISSING_CODES:
                raise ItemsUnavailable(
                    ConditionReason.ITEMS_NOT_FOUND,
                    f"spec.itemsFrom.object names {where}, which does not exist: upload it (kubectl "
                    "campaign apply --items FILE does) or fix spec.itemsFrom.object.key",
                ) from None
            if _code(error) in _PRECONDITION_CODES and if_match:
                raise ItemsChanged(where, f"ETag {if_match}", "another version") from None
            raise
        etag = answer.get("ETag")
        if if_match and etag and etag != if_match:  # a store that ignores If-Match on GET
            answer["Body"].close()
            raise ItemsChanged(where, f"ETag {if_match}", f"ETag {etag}")
        size = int(answer.get("ContentLength") or 0)
        if size > MAX_ITEMS_OBJECT_BYTES:
            answer["Body"].close()
            raise ItemsUnavailable(
                ConditionReason.ITEMS_INVALID,
                f"{where} is {size} bytes, over the {MAX_ITEMS_OBJECT_BYTES} bytes an itemsFrom object may "
                "have: split the input into several campaigns",
            )
        gzipped = key.endswith(".gz") or answer.get("ContentEncoding") == "gzip"
        return OpenedItems(
            _closing(answer["Body"], object_lines(answer["Body"].read, where, gzipped=gzipped)), etag
        )

    def probe(self) -> None:
        """StoreUnavailable unless the bucket answers with these credentials."""
        from botocore.exceptions import ClientError

        try:
            self._call("HEAD bucket", "head_bucket", expected=frozenset(_BUCKET_PROBE_CODES))
        except ClientError as error:
            code = _code(error)
            name = "NoSuchBucket" if code == "404" else "AccessDenied"
            raise StoreUnavailable(
                f"S3 HEAD bucket in {self.describe()} failed with {name}: {_BUCKET_PROBE_CODES[code]}"
            ) from error

    # --- results -----------------------------------------------------------------------------------

    def _verified(self, name: str, body: bytes, metadata: Mapping[str, str], key: str) -> StoredResult:
        text = body.decode("utf-8", errors="replace")
        actual = sha256_of(body)
        recorded = metadata.get(FINGERPRINT_META)
        if recorded != actual:
            raise StoreCorrupt(f"object {name}: fingerprint {recorded} does not match its bytes ({actual})")
        if metadata.get(BYTES_META) != str(len(body)):
            raise StoreCorrupt(f"object {name}: recorded {metadata.get(BYTES_META)} bytes, holds {len(body)}")
        check_document(text, key, f"object {name}")
        return StoredResult(name, actual, len(body), text, dict(metadata))

    def read_ref(self, ref: str, key: str) -> StoredResult:
        found = self._get(ref)
        if found is None:
            raise StoreCorrupt(f"object {ref} (the shard's result) does not exist in {self.describe()}")
        return self._verified(ref, *found, key)

    def read_result(self, key: str) -> StoredResult | None:
        """The key's committed result, verified; None when none was committed."""
        pointer = self._get(self.pointer_name(key))
        if pointer is None:
            return None
        where = f"object {self.pointer_name(key)}"
        return follow_pointer(pointer[0], where, lambda ref: self.read_ref(ref, key))

    def find_result(self, key: str, token: int | None, *, committed: bool = True) -> StoredResult | None:
        """The key's committed result (unless `committed` is False), else the claim `token`'s own
        object (written whole, before its Done write; committed only after it), verified."""
        result = self.read_result(key) if committed else None
        if result is not None or token is None:
            return result
        name = self.attempt_name(key, token)
        found = self._get(name)
        return None if found is None else self._verified(name, *found, key)

    def store_result(
        self, key: str, text: str, meta: ResultMeta, item_count: int
    ) -> tuple[StoredResult, bool]:
        """Write this claim's result object (not yet the key's result: `commit` makes it that)."""
        body = text.encode("utf-8")
        check_size(f"the result of shard {meta.shard} would", len(body), self.max_bytes, CAP_FIX)
        name = self.attempt_name(key, meta.token)
        metadata = {
            FINGERPRINT_META: sha256_of(body),
            BYTES_META: str(len(body)),
            "items": str(item_count),
            "campaign": meta.campaign,
            "shard": meta.shard,
            "owner": meta.owner,
            "attempt": str(meta.attempt),
            "token": str(meta.token),
        }
        if not self._put_once(name, body, metadata, "application/json"):
            # This claim wrote it before (a retried call): keep that one if it verifies.
            found = self._get(name)
            if found is None:
                raise StoreUnavailable(f"object {name} was there and is gone; it is retried")
            return self._verified(name, *found, key), False
        return StoredResult(name, metadata[FINGERPRINT_META], len(body), text, metadata), False

    def commit(self, key: str, stored: StoredResult) -> None:
        """Make `stored` the key's result, unless one was committed before (that one stays)."""
        pointer = encode_pointer(key, stored).encode("utf-8")
        self._put_once(self.pointer_name(key), pointer, {}, "application/json")

    # --- purge -------------------------------------------------------------------------------------

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (1,000 per request); how many were deleted."""
        names = list(self._list(prefix))
        for start in range(0, len(names), 1000):
            batch = [{"Key": name} for name in names[start : start + 1000]]
            self._call(f"DELETE {prefix}*", "delete_objects", Delete={"Objects": batch, "Quiet": True})
        return len(names)

    # --- retention records (scheduler/retention.py) ------------------------------------------------

    def retention_prefix(self) -> str:
        """The retention records of every namespace under this store's prefix: `_retention/` can
        not clash with a namespace's own folder (no namespace name has an underscore)."""
        prefix = self.location.prefix.strip("/")
        return f"{prefix}/_retention/" if prefix else "_retention/"

    def retention_name(self, campaign: str, uid: str, finished: int) -> str:
        return f"{self.retention_prefix()}{self.namespace}/{campaign}/{uid}-{finished}.json"

    def put_record(self, name: str, document: Mapping[str, Any]) -> bool:
        """Write a small JSON record once (If-None-Match); False when it was there already."""
        return self._put_once(name, canonical_json(document).encode("utf-8"), {}, "application/json")

    def get_record(self, name: str) -> dict[str, Any] | None:
        found = self._get(name)
        if found is None:
            return None
        value = json.loads(found[0])
        return value if isinstance(value, dict) else None

    def delete_key(self, key: str) -> int:
        """Delete everything stored under one idempotency key: its pointer first (a key left half
        deleted then reads as no result, never as a pointer to a deleted object), attempts, item chunks."""
        deleted = self.delete_prefix(self.pointer_name(key))
        deleted += self.delete_prefix(self.attempts_prefix(key))
        return deleted + self.delete_prefix(self.items_prefix(key))

    # --- inputs ------------------------------------------------------------------------------------

    def input_prefix(self, campaign: str) -> str:
        return f"{self._root()}inputs/{campaign}/"

    def upload_once(
        self, key: str, body: Any, content_type: str, metadata: Mapping[str, str] | None = None
    ) -> bool:
        """Upload a file object under `key` unless an object is there (keys are content-addressed,
        so one there holds the same bytes); False when skipped. Large files go in parts."""
        if self.head(key) is not None:
            return False
        extra: dict[str, Any] = {"ContentType": content_type}
        if metadata:
            extra["Metadata"] = dict(metadata)
        self._call(
            f"PUT {key}", "upload_fileobj", Fileobj=body, Key=key, ExtraArgs=extra, Config=upload_transfer()
        )
        return True

    def head(self, key: str) -> dict[str, Any] | None:
        """The object's size (`ContentLength`) and `Metadata`; None when there is none of that key."""
        from botocore.exceptions import ClientError

        try:
            answer: dict[str, Any] = self._call(f"HEAD {key}", "head_object", Key=key)
            return answer
        except ClientError as error:
            if _code(error) not in _MISSING_CODES:
                raise
            return None

    # --- the ledger of folded shards ----------------------------------------------------------------

    def ledger_prefix(self, campaign: str, uid: str) -> str:
        return f"{self._root()}ledger/{campaign}-{uid}/"

    def write_ledger(
        self, campaign: str, uid: str, sequence: int, records: Sequence[Mapping[str, Any]]
    ) -> str:
        """One segment of the ledger; its name is new every time, so a fold retried after a failed
        status write never collides with the segment it wrote before (readers de-duplicate)."""
        name = f"{self.ledger_prefix(campaign, uid)}{sequence:08d}-{secrets.token_hex(4)}.jsonl"
        body = "".join(canonical_json(dict(record)) + "\n" for record in records).encode("utf-8")
        self._put_once(name, body, {"campaign": campaign, "sequence": str(sequence)}, "application/x-ndjson")
        return name

    def read_ledger(self, campaign: str, uid: str) -> Iterator[dict[str, Any]]:
        """Every line of every segment, oldest segment first (sequence order)."""
        for segment in self.read_ledger_segments(campaign, uid):
            yield from segment

    def read_ledger_sequence(self, campaign: str, uid: str, sequence: int) -> list[dict[str, Any]]:
        """The lines of the segments written under one fold sequence (one, or a few when a fold's
        status write was lost and it was written again), in name order."""
        lines: list[dict[str, Any]] = []  # at most a few segments of MAX_FOLD lines
        for name in sorted(self._list(f"{self.ledger_prefix(campaign, uid)}{sequence:08d}-")):
            found = self._get(name)
            if found is not None:
                lines += [json.loads(line) for line in found[0].splitlines() if line.strip()]
        return lines

    def read_ledger_segments(self, campaign: str, uid: str) -> Iterator[list[dict[str, Any]]]:
        """The ledger one segment at a time, oldest first: a reader holds one segment (at most
        `scheduler.fold.MAX_FOLD` lines) and may act between two (the finalize shard renews)."""
        for name in sorted(self._list(self.ledger_prefix(campaign, uid))):
            found = self._get(name)
            if found is None:
                continue
            yield [json.loads(line) for line in found[0].splitlines() if line.strip()]

    # --- item results ------------------------------------------------------------------------------

    def read_items(self, key: str, wanted: Iterable[str]) -> tuple[dict[str, ItemRecord], list[str]]:
        """Verified item results every claim of this key flushed, and the sub-keys that failed to verify.

        Bounded by the shard: one chunk per heartbeat flush of each attempt of this key.
        """
        want = set(wanted)
        found: dict[str, ItemRecord] = {}
        corrupt: set[str] = set()
        for name in self._list(self.items_prefix(key)):
            chunk = self._get(name)
            if chunk is None:
                continue
            for line in chunk[0].splitlines():
                try:
                    subkey = json.loads(line).get("key")
                except (ValueError, AttributeError):
                    continue
                if subkey not in want or subkey in found:
                    continue
                record = decode_item(line)
                if record is None:
                    corrupt.add(subkey)
                else:
                    found[subkey] = record
                    corrupt.discard(subkey)
        return found, sorted(corrupt)

    def save_items(
        self, key: str, campaign: str, records: Mapping[str, ItemRecord], shard: str, token: int
    ) -> int:
        if not records:
            return 0
        lines = []
        for subkey, record in records.items():
            entry = json.loads(record.encode())
            lines.append(canonical_json({"key": subkey, **entry}))
        body = ("\n".join(lines) + "\n").encode("utf-8")
        check_size(f"the item results of shard {shard}", len(body), self.max_bytes, CAP_FIX)
        sequence = self._chunks.get((key, token), 0) + 1
        name = f"{self.items_prefix(key)}t{token}-{sequence:06d}.jsonl"
        self._put_once(name, body, {"campaign": campaign, "shard": shard}, "application/x-ndjson")
        self._chunks[(key, token)] = sequence
        return len(records)
