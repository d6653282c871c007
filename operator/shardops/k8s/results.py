"""The default result store: ConfigMaps in the campaign's namespace, named by idempotency key.

Two ConfigMaps per shard key, neither owned by anything, so results outlive a deleted Campaign and
a re-applied one finds them (docs/architecture.md, "Objects"):

* `shardops-items-<key label>`: one entry per finished item, keyed by the item's sub-key. Workers
  add entries as they heartbeat, so a retry resumes where the last flush left off. An entry that
  is there and verifies is never overwritten: its sub-key says the input is the same.
* `shardops-result-<key label>`: the shard's result, written once (create-if-absent), with the
  SHA-256 of its exact bytes and their length in annotations. A reader trusts it only when both
  check, so a half-written or edited result is recomputed, never returned.

Body builders and checks are pure; the I/O functions are a few calls each through `Kube`.
A result over the size cap is refused with `ResultTooLarge` before anything is written: the
store holds whole results or none.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardops import API_GROUP
from shardops.api.enums import ErrorClass
from shardops.api.names import CAMPAIGN_LABEL, IDEMPOTENCY_KEY_LABEL
from shardops.k8s.api import CONFIGMAPS, AlreadyExists, Conflict, Kube, NotFound
from shardops.logic.idempotency import canonical_json, fingerprint, key_label

JSON = dict[str, Any]

API_PREFIX = API_GROUP
RESULT_PREFIX = "shardops-result-"
ITEMS_PREFIX = "shardops-items-"
RESULT_DATA_KEY = "result.json"
FINGERPRINT_ANNOTATION = f"{API_PREFIX}/fingerprint"
BYTES_ANNOTATION = f"{API_PREFIX}/bytes"
KEY_ANNOTATION = f"{API_PREFIX}/idempotency-key"
ITEMS_ANNOTATION = f"{API_PREFIX}/items"
SHARD_ANNOTATION = f"{API_PREFIX}/shard"
OWNER_ANNOTATION = f"{API_PREFIX}/owner"
ATTEMPT_ANNOTATION = f"{API_PREFIX}/attempt"
# A ConfigMap is at most 1 MiB including metadata; 900 KiB of data leaves room for the rest.
DEFAULT_MAX_BYTES = 900 * 1024
_SHA256 = "sha256:"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_MAX = 63
# Read-modify-write of the items ConfigMap races only with other writers of the same shard key
# (a stale worker, or an identical shard of another campaign incarnation): a few rounds suffice.
_WRITE_ROUNDS = 5


class ResultTooLarge(Exception):
    """The result does not fit the store. Not retryable: the same input gives the same size."""

    error_class = ErrorClass.RESULT_TOO_LARGE


class StoreCorrupt(Exception):
    """An entry is present but does not verify; it is treated as absent and recomputed."""


@dataclass(frozen=True)
class ItemRecord:
    """One item's result as the command reported it."""

    result: Any
    cost: float = 0.0

    def encode(self) -> str:
        return canonical_json(
            {"cost": self.cost, "fingerprint": fingerprint(self.result), "result": self.result}
        )


@dataclass(frozen=True)
class StoredResult:
    """A shard result that is in the store and verified: what `status.result` points at."""

    name: str
    fingerprint: str
    bytes: int
    text: str
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class ResultMeta:
    """Who wrote a result: recorded as annotations for audits, never used to decide anything."""

    campaign: str
    shard: str
    owner: str
    attempt: int


def store_label(key: str) -> str:
    """A label value / DNS label for an idempotency key, whatever form the operator wrote it in."""
    if key.startswith(_SHA256):
        return key_label(key)
    if len(key) <= _LABEL_MAX and _DNS_LABEL.match(key):
        return key
    return key_label(fingerprint(key))


def result_name(key: str) -> str:
    return RESULT_PREFIX + store_label(key)


def items_name(key: str) -> str:
    return ITEMS_PREFIX + store_label(key)


def item_data_key(subkey: str) -> str:
    """ConfigMap data keys allow [-._a-zA-Z0-9] only; the full digest is kept (no truncation)."""
    return subkey.replace(":", "-", 1)


def sha256_of(text: str) -> str:
    return _SHA256 + hashlib.sha256(text.encode("utf-8")).hexdigest()


def encode_result(key: str, entries: Sequence[tuple[int, str, Any]]) -> str:
    """The shard result: canonical JSON, so its bytes (and fingerprint) depend on the content only.

    `entries` are (index in shard, item sub-key, result), one per item, in index order.
    """
    document = {
        "idempotencyKey": key,
        "items": [{"index": index, "key": subkey, "result": result} for index, subkey, result in entries],
    }
    return canonical_json(document)


def check_size(what: str, size: int, cap: int) -> None:
    if size > cap:
        raise ResultTooLarge(
            f"{what} take {size} bytes, over the result size cap of {cap} bytes "
            "(SHARDOPS_RESULT_MAX_BYTES; a ConfigMap holds at most 1 MiB): nothing was stored. "
            "Use a smaller spec.shardSize or make the command's results smaller"
        )


def _labels(key: str, campaign: str) -> dict[str, str]:
    return {IDEMPOTENCY_KEY_LABEL: store_label(key), CAMPAIGN_LABEL: campaign}


def result_body(key: str, text: str, meta: ResultMeta, item_count: int) -> JSON:
    """The result ConfigMap. No ownerReferences: the result must outlive its Campaign."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": result_name(key),
            "labels": _labels(key, meta.campaign),
            "annotations": {
                FINGERPRINT_ANNOTATION: sha256_of(text),
                BYTES_ANNOTATION: str(len(text.encode("utf-8"))),
                KEY_ANNOTATION: key,
                ITEMS_ANNOTATION: str(item_count),
                SHARD_ANNOTATION: meta.shard,
                OWNER_ANNOTATION: meta.owner,
                ATTEMPT_ANNOTATION: str(meta.attempt),
            },
        },
        "data": {RESULT_DATA_KEY: text},
    }


def check_result(configmap: Mapping[str, Any], key: str) -> StoredResult:
    """The stored result if its bytes match the recorded fingerprint and length, else StoreCorrupt."""
    metadata = configmap.get("metadata") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    text = (configmap.get("data") or {}).get(RESULT_DATA_KEY)
    name = str(metadata.get("name") or "")
    if not isinstance(text, str):
        raise StoreCorrupt(f"ConfigMap {name} has no {RESULT_DATA_KEY}")
    recorded = annotations.get(FINGERPRINT_ANNOTATION)
    actual = sha256_of(text)
    if recorded != actual:
        raise StoreCorrupt(f"ConfigMap {name}: fingerprint {recorded} does not match its data ({actual})")
    size = len(text.encode("utf-8"))
    if annotations.get(BYTES_ANNOTATION) != str(size):
        raise StoreCorrupt(
            f"ConfigMap {name}: recorded {annotations.get(BYTES_ANNOTATION)} bytes, holds {size}"
        )
    try:
        stored_key = json.loads(text).get("idempotencyKey")
    except (json.JSONDecodeError, AttributeError):
        raise StoreCorrupt(f"ConfigMap {name}: {RESULT_DATA_KEY} is not a result document") from None
    if stored_key != key:
        # Two keys sharing a 224-bit label prefix would land here; so would a hand-made ConfigMap.
        raise StoreCorrupt(f"ConfigMap {name} holds the result of {stored_key!r}, not {key!r}")
    return StoredResult(name, actual, size, text, dict(annotations))


def decode_items(data: Mapping[str, str], wanted: Iterable[str]) -> tuple[dict[str, ItemRecord], list[str]]:
    """Verified records for the `wanted` sub-keys, and the sub-keys whose stored entry failed to verify."""
    found: dict[str, ItemRecord] = {}
    corrupt: list[str] = []
    for subkey in wanted:
        raw = data.get(item_data_key(subkey))
        if raw is None:
            continue
        record = _decode_item(raw)
        if record is None:
            corrupt.append(subkey)
        else:
            found[subkey] = record
    return found, corrupt


def _decode_item(raw: str) -> ItemRecord | None:
    try:
        value = json.loads(raw)
        if not isinstance(value, dict) or "result" not in value:
            return None
        if value.get("fingerprint") != fingerprint(value["result"]):
            return None
        cost = value.get("cost", 0)
        if isinstance(cost, bool) or not isinstance(cost, int | float):
            return None
        return ItemRecord(value["result"], float(cost))
    except (ValueError, TypeError):
        return None


def data_size(data: Mapping[str, str]) -> int:
    return sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in data.items())


def items_additions(existing: Mapping[str, str], records: Mapping[str, ItemRecord]) -> dict[str, str]:
    """Entries to add: those missing, or present but not verifying. A valid entry is never replaced."""
    additions: dict[str, str] = {}
    for subkey, record in records.items():
        data_key = item_data_key(subkey)
        raw = existing.get(data_key)
        if raw is not None and _decode_item(raw) is not None:
            continue
        additions[data_key] = record.encode()
    return additions


def items_body(key: str, campaign: str, data: Mapping[str, str]) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": items_name(key),
            "labels": _labels(key, campaign),
            "annotations": {KEY_ANNOTATION: key},
        },
        "data": dict(data),
    }


# --- I/O ------------------------------------------------------------------------------------------


def read_result(kube: Kube, namespace: str, key: str) -> StoredResult | None:
    """The verified result under `key`; None when absent. StoreCorrupt when present but invalid."""
    try:
        configmap = kube.get(CONFIGMAPS, namespace, result_name(key))
    except NotFound:
        return None
    return check_result(configmap, key)


def store_result(
    kube: Kube, namespace: str, key: str, text: str, meta: ResultMeta, item_count: int, cap: int
) -> tuple[StoredResult, bool]:
    """Store `text` under `key` unless a valid result is there already; (result, True) when reused.

    Create-if-absent: a worker never overwrites a valid result of the same key, whoever wrote it
    (any result stored under a key is a result of that input). Only a result that fails its
    fingerprint check is replaced, with its resourceVersion as precondition.
    """
    check_size(f"the result of shard {meta.shard} would", len(text.encode("utf-8")), cap)
    body = result_body(key, text, meta, item_count)
    for _ in range(_WRITE_ROUNDS):
        try:
            created = kube.create(CONFIGMAPS, namespace, body)
            return check_result(created, key), False
        except AlreadyExists:
            pass
        try:
            current = kube.get(CONFIGMAPS, namespace, result_name(key))
        except NotFound:
            continue
        try:
            return check_result(current, key), True
        except StoreCorrupt:
            pass
        replacement = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        try:
            replaced = kube.replace(CONFIGMAPS, namespace, result_name(key), replacement)
            return check_result(replaced, key), False
        except (Conflict, NotFound):
            continue
    raise Conflict(409, "Conflict", f"result ConfigMap {result_name(key)} kept changing while storing it")


def read_items(
    kube: Kube, namespace: str, key: str, wanted: Iterable[str]
) -> tuple[dict[str, ItemRecord], list[str]]:
    """Stored, verified item results of the shard with `key` (for resuming), and corrupt sub-keys."""
    try:
        configmap = kube.get(CONFIGMAPS, namespace, items_name(key))
    except NotFound:
        return {}, []
    return decode_items(configmap.get("data") or {}, wanted)


def save_items(
    kube: Kube,
    namespace: str,
    key: str,
    campaign: str,
    records: Mapping[str, ItemRecord],
    cap: int,
    shard: str | None = None,
) -> int:
    """Add `records` to the shard's items ConfigMap; returns how many entries were written.

    Read-modify-write with the resourceVersion as precondition, adding only missing (or corrupt)
    entries, so concurrent writers of the same key never lose each other's entries. Raises
    ResultTooLarge, writing nothing, when the ConfigMap would pass `cap`.
    """
    name = items_name(key)
    for _ in range(_WRITE_ROUNDS):
        try:
            current: JSON | None = kube.get(CONFIGMAPS, namespace, name)
        except NotFound:
            current = None
        existing: Mapping[str, str] = (current or {}).get("data") or {}
        additions = items_additions(existing, records)
        if not additions:
            return 0
        owner = f"shard {shard}" if shard else f"key {store_label(key)}"
        check_size(f"the item results of {owner}", data_size({**existing, **additions}), cap)
        try:
            if current is None:
                kube.create(CONFIGMAPS, namespace, items_body(key, campaign, additions))
            else:
                kube.patch(
                    CONFIGMAPS,
                    namespace,
                    name,
                    {"data": additions},
                    resource_version=current["metadata"]["resourceVersion"],
                )
        except (Conflict, NotFound):
            continue
        return len(additions)
    raise Conflict(409, "Conflict", f"items ConfigMap {name} kept changing while adding results")
