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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shardops import API_GROUP
from shardops.api.enums import StoreType
from shardops.api.names import CAMPAIGN_LABEL, IDEMPOTENCY_KEY_LABEL
from shardops.k8s.api import CONFIGMAPS, AlreadyExists, Conflict, Kube, NotFound
from shardops.store.records import (
    ItemRecord,
    ResultMeta,
    StoreCorrupt,
    StoredResult,
    check_document,
    check_size,
    decode_item,
    sha256_of,
    store_label,
)

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
# What a user does when a campaign outgrows this store.
CAP_FIX = "SHARDOPS_RESULT_MAX_BYTES; a ConfigMap holds at most 1 MiB: configure an S3 result store"
# Read-modify-write of the items ConfigMap races only with other writers of the same shard key
# (a stale worker, or an identical shard of another campaign incarnation): a few rounds suffice.
_WRITE_ROUNDS = 5


def result_name(key: str) -> str:
    return RESULT_PREFIX + store_label(key)


def items_name(key: str) -> str:
    return ITEMS_PREFIX + store_label(key)


def item_data_key(subkey: str) -> str:
    """ConfigMap data keys allow [-._a-zA-Z0-9] only; the full digest is kept (no truncation)."""
    return subkey.replace(":", "-", 1)


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
    check_document(text, key, f"ConfigMap {name}: {RESULT_DATA_KEY}")
    return StoredResult(name, actual, size, text, dict(annotations))


def decode_items(data: Mapping[str, str], wanted: Iterable[str]) -> tuple[dict[str, ItemRecord], list[str]]:
    """Verified records for the `wanted` sub-keys, and the sub-keys whose stored entry failed to verify."""
    found: dict[str, ItemRecord] = {}
    corrupt: list[str] = []
    for subkey in wanted:
        raw = data.get(item_data_key(subkey))
        if raw is None:
            continue
        record = decode_item(raw)
        if record is None:
            corrupt.append(subkey)
        else:
            found[subkey] = record
    return found, corrupt


def data_size(data: Mapping[str, str]) -> int:
    return sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in data.items())


def items_additions(existing: Mapping[str, str], records: Mapping[str, ItemRecord]) -> dict[str, str]:
    """Entries to add: those missing, or present but not verifying. A valid entry is never replaced."""
    additions: dict[str, str] = {}
    for subkey, record in records.items():
        data_key = item_data_key(subkey)
        raw = existing.get(data_key)
        if raw is not None and decode_item(raw) is not None:
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
    check_size(f"the result of shard {meta.shard} would", len(text.encode("utf-8")), cap, CAP_FIX)
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
        check_size(f"the item results of {owner}", data_size({**existing, **additions}), cap, CAP_FIX)
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


def read_ref(kube: Kube, namespace: str, ref: str, key: str) -> StoredResult:
    """The verified result a Done shard's `status.result.ref` names; StoreCorrupt when absent or bad."""
    try:
        configmap = kube.get(CONFIGMAPS, namespace, ref)
    except NotFound:
        raise StoreCorrupt(f"ConfigMap {ref} (the shard's result) does not exist") from None
    return check_result(configmap, key)


@dataclass
class ConfigMapStore:
    """The ConfigMap store bound to one namespace: the `ResultStore` the worker and the CLI use."""

    kube: Kube
    namespace: str
    max_bytes: int = DEFAULT_MAX_BYTES

    type = StoreType.CONFIG_MAP

    def describe(self) -> str:
        return f"ConfigMaps in namespace {self.namespace}"

    def read_result(self, key: str) -> StoredResult | None:
        return read_result(self.kube, self.namespace, key)

    def store_result(
        self, key: str, text: str, meta: ResultMeta, item_count: int
    ) -> tuple[StoredResult, bool]:
        return store_result(self.kube, self.namespace, key, text, meta, item_count, self.max_bytes)

    def commit(self, key: str, stored: StoredResult) -> None:
        """Nothing to do: the result ConfigMap is the key's result from its creation on."""

    def find_result(self, key: str, token: int | None) -> StoredResult | None:
        # A result ConfigMap is the key's result the moment it is created, whoever's claim it was.
        return self.read_result(key)

    def read_ref(self, ref: str, key: str) -> StoredResult:
        return read_ref(self.kube, self.namespace, ref, key)

    def read_items(self, key: str, wanted: Iterable[str]) -> tuple[dict[str, ItemRecord], list[str]]:
        return read_items(self.kube, self.namespace, key, wanted)

    def save_items(
        self, key: str, campaign: str, records: Mapping[str, ItemRecord], shard: str, token: int
    ) -> int:
        return save_items(self.kube, self.namespace, key, campaign, records, self.max_bytes, shard=shard)
