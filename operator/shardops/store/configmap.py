"""The default result store: ConfigMaps in the campaign's namespace, named by idempotency key.

Three kinds of ConfigMap per shard key, none owned by anything, so results outlive a deleted
Campaign and a re-applied one finds them (docs/architecture.md, "Objects"). The layout is the S3
store's, so a result is tied to the claim that computed it in both:

* `shardops-items-<key label>`: one entry per finished item, keyed by the item's sub-key. Workers
  add entries as they heartbeat, so a retry resumes where the last flush left off. An entry that
  is there and verifies is never overwritten: its sub-key says the input is the same.
* `shardops-attempt-<key label>-t<token>`: the shard result one claim computed, written once
  (create-if-absent), with the SHA-256 of its exact bytes and their length in annotations. The
  token is the claim's Lease fencing token, so two claims of a shard never write the same one.
  A reader trusts it only when both check, so a half-written or edited result is recomputed, never
  returned.
* `shardops-result-<key label>`: the key's committed result, a small pointer {ref, fingerprint,
  bytes} to one attempt ConfigMap, created once and only after the fenced Done write of that
  claim succeeded (`commit`). A stale holder (its Lease taken over while it was frozen) can create
  its attempt ConfigMap, but its Done write is refused, so nothing ever points at it: it never
  becomes a result. Earlier releases wrote the whole result here instead (data `result.json`, as
  an attempt ConfigMap holds it); those are still read and stay the key's result.

Calls per shard: one write more than before results were tied to claims — the commit, after the
Done write — accepted for it; reusing a result on re-apply reads two ConfigMaps (the pointer, then
the attempt it names) instead of one. Both O(1) per shard.

Body builders and checks are pure; the I/O functions are a few calls each through `Kube`.
A result over the size cap is refused with `ResultTooLarge` before anything is written: the
store holds whole results or none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3

from shardops import API_GROUP
from shardops.api.common import JSON
from shardops.api.enums import StoreType
from shardops.api.names import CAMPAIGN_LABEL, IDEMPOTENCY_KEY_LABEL
from shardops.k8s.api import CONFIGMAPS, AlreadyExists, ApiError, Conflict, KubeClient, NotFound
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

API_PREFIX = API_GROUP
RESULT_PREFIX = "shardops-result-"
ATTEMPT_PREFIX = "shardops-attempt-"
ITEMS_PREFIX = "shardops-items-"
# Every ConfigMap this store writes starts with one of these.
PREFIXES = (RESULT_PREFIX, ATTEMPT_PREFIX, ITEMS_PREFIX)
RESULT_DATA_KEY = "result.json"
POINTER_DATA_KEY = "pointer.json"
FINGERPRINT_ANNOTATION = f"{API_PREFIX}/fingerprint"
BYTES_ANNOTATION = f"{API_PREFIX}/bytes"
KEY_ANNOTATION = f"{API_PREFIX}/idempotency-key"
ITEMS_ANNOTATION = f"{API_PREFIX}/items"
SHARD_ANNOTATION = f"{API_PREFIX}/shard"
OWNER_ANNOTATION = f"{API_PREFIX}/owner"
ATTEMPT_ANNOTATION = f"{API_PREFIX}/attempt"
TOKEN_ANNOTATION = f"{API_PREFIX}/fencing-token"
# The campaign label's key as an annotation too: a StoredResult carries the annotations only, and
# `commit` labels the key's pointer with the campaign of the claim it names.
CAMPAIGN_ANNOTATION = CAMPAIGN_LABEL
# A ConfigMap is at most 1 MiB including metadata; 900 KiB of data leaves room for the rest.
DEFAULT_MAX_BYTES = 900 * 1024
# What a user does when a campaign outgrows this store.
CAP_FIX = "SHARDOPS_RESULT_MAX_BYTES; a ConfigMap holds at most 1 MiB: configure an S3 result store"
# Read-modify-write of the items ConfigMap races only with other writers of the same shard key
# (a stale worker, or an identical shard of another campaign incarnation): a few rounds suffice.
_WRITE_ROUNDS = 5


def result_name(key: str) -> str:
    """The key's committed result (a pointer; the whole result when an earlier release wrote it)."""
    return RESULT_PREFIX + store_label(key)


def attempts_prefix(key: str) -> str:
    return f"{ATTEMPT_PREFIX}{store_label(key)}-t"


def attempt_name(key: str, token: int) -> str:
    """The result the claim with fencing token `token` computed. At most 17 + 63 + 2 + 20
    characters, well inside a ConfigMap name's 253, and a DNS subdomain like the key label."""
    return f"{attempts_prefix(key)}{token}"


def items_name(key: str) -> str:
    return ITEMS_PREFIX + store_label(key)


def item_data_key(subkey: str) -> str:
    """ConfigMap data keys allow [-._a-zA-Z0-9] only; the full digest is kept (no truncation)."""
    return subkey.replace(":", "-", 1)


def _labels(key: str, campaign: str | None) -> dict[str, str]:
    labels = {IDEMPOTENCY_KEY_LABEL: store_label(key)}
    if campaign:
        labels[CAMPAIGN_LABEL] = campaign
    return labels


def _claim_annotations(meta: ResultMeta) -> dict[str, str]:
    """Which claim wrote an attempt ConfigMap: for audits, and to recognise our own on a retry."""
    return {
        SHARD_ANNOTATION: meta.shard,
        OWNER_ANNOTATION: meta.owner,
        ATTEMPT_ANNOTATION: str(meta.attempt),
        TOKEN_ANNOTATION: str(meta.token),
    }


def attempt_body(key: str, text: str, meta: ResultMeta, item_count: int) -> JSON:
    """One claim's result ConfigMap. No ownerReferences: the result must outlive its Campaign."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": attempt_name(key, meta.token),
            "labels": _labels(key, meta.campaign),
            "annotations": {
                FINGERPRINT_ANNOTATION: sha256_of(text),
                BYTES_ANNOTATION: str(len(text.encode("utf-8"))),
                KEY_ANNOTATION: key,
                ITEMS_ANNOTATION: str(item_count),
                CAMPAIGN_ANNOTATION: meta.campaign,
                **_claim_annotations(meta),
            },
        },
        "data": {RESULT_DATA_KEY: text},
    }


def pointer_body(key: str, stored: StoredResult) -> JSON:
    """The key's committed result: a pointer to the attempt ConfigMap `stored`, not a copy of it.
    A copy would spare one GET when a re-applied campaign reuses the result, but store every result
    twice in etcd, whose quota (2 GiB for the whole cluster) is what caps this store at
    CONFIGMAP_STORE_MAX_SHARDS; the pointer is a few hundred bytes. It also keeps one name per
    result: a reused result's ref is the attempt ConfigMap the first Done shard recorded."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": result_name(key),
            "labels": _labels(key, stored.annotations.get(CAMPAIGN_ANNOTATION)),
            "annotations": {KEY_ANNOTATION: key},
        },
        "data": {POINTER_DATA_KEY: encode_pointer(key, stored)},
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


def check_committed(
    configmap: Mapping[str, Any], key: str, read_ref: Callable[[str], StoredResult]
) -> StoredResult:
    """The result the key's committed ConfigMap holds: the attempt its pointer names (read with
    `read_ref`), or the whole result when an earlier release wrote it. StoreCorrupt when invalid."""
    data = configmap.get("data") or {}
    if RESULT_DATA_KEY in data:
        return check_result(configmap, key)
    where = f"ConfigMap {(configmap.get('metadata') or {}).get('name')}"
    return follow_pointer(data.get(POINTER_DATA_KEY, ""), where, read_ref)


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


def read_result(kube: KubeClient, namespace: str, key: str) -> StoredResult | None:
    """The key's committed result, verified; None when none was committed. StoreCorrupt when
    present but invalid. Two reads (the pointer, the attempt it names); one for an earlier release's."""
    try:
        configmap = kube.get(CONFIGMAPS, namespace, result_name(key))
    except NotFound:
        return None
    return check_committed(configmap, key, lambda ref: read_ref(kube, namespace, ref, key))


def find_result(
    kube: KubeClient, namespace: str, key: str, token: int | None, *, committed: bool = True
) -> StoredResult | None:
    """The key's committed result (unless `committed` is False), else the claim `token`'s own attempt
    (stored whole before its Done write; committed only after it), verified. At most two reads."""
    found = read_result(kube, namespace, key) if committed else None
    if found is not None or token is None:
        return found
    try:
        configmap = kube.get(CONFIGMAPS, namespace, attempt_name(key, token))
    except NotFound:
        return None
    return check_result(configmap, key)


def store_result(
    kube: KubeClient, namespace: str, key: str, text: str, meta: ResultMeta, item_count: int, cap: int
) -> tuple[StoredResult, bool]:
    """Store `text` as the claim `meta`'s own result, its attempt ConfigMap; not the key's result yet
    (`commit` makes it that, after the claim's Done write): (stored, False).

    Create-if-absent. The name holds the claim's fencing token, so a ConfigMap already there is this
    claim's own, from a create retried after its answer was lost: kept if it verifies. One that does
    not verify is replaced, with its resourceVersion as precondition. One that verifies but another
    Shard's claim wrote (the same key and the same token, since tokens count per Lease: another
    campaign, or an earlier Campaign of the same name) is a result of the same input and is kept, as
    the S3 store keeps such an object: refusing it would charge this shard an attempt per leftover
    token. The stale holders this store fences are claims of the same Shard, whose tokens differ.
    """
    check_size(f"the result of shard {meta.shard} would", len(text.encode("utf-8")), cap, CAP_FIX)
    body = attempt_body(key, text, meta, item_count)
    name = body["metadata"]["name"]
    for _ in range(_WRITE_ROUNDS):
        try:
            created = kube.create(CONFIGMAPS, namespace, body)
            return check_result(created, key), False
        except AlreadyExists:
            pass
        try:
            current = kube.get(CONFIGMAPS, namespace, name)
        except NotFound:
            continue
        try:
            stored = check_result(current, key)
        except StoreCorrupt:
            replacement = {
                **body,
                "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
            }
            try:
                replaced = kube.replace(CONFIGMAPS, namespace, name, replacement)
                return check_result(replaced, key), False
            except (Conflict, NotFound):
                continue
        return stored, False
    raise Conflict(409, "Conflict", f"result ConfigMap {name} kept changing while storing it")


def commit(kube: KubeClient, namespace: str, key: str, stored: StoredResult) -> None:
    """Make `stored` the key's result, unless one was committed before (that one stays)."""
    with contextlib.suppress(AlreadyExists):
        kube.create(CONFIGMAPS, namespace, pointer_body(key, stored))


def purge_names(kube: KubeClient, namespace: str, key: str, campaign: str) -> list[str]:
    """The ConfigMaps under `key` that purging `campaign` deletes: the key's committed result and
    item results (by name), and the attempt ConfigMaps of the campaign's claims, found by their
    labels (one LIST; their names hold tokens no one keeps). Other campaigns' attempts of the key
    stay: their Done shards may name them."""
    selector = f"{IDEMPOTENCY_KEY_LABEL}={store_label(key)},{CAMPAIGN_LABEL}={campaign}"
    found = (c["metadata"]["name"] for c in kube.list(CONFIGMAPS, namespace, label_selector=selector))
    return [
        result_name(key),
        items_name(key),
        *sorted(n for n in found if n.startswith(attempts_prefix(key))),
    ]


def read_items(
    kube: KubeClient, namespace: str, key: str, wanted: Iterable[str]
) -> tuple[dict[str, ItemRecord], list[str]]:
    """Stored, verified item results of the shard with `key` (for resuming), and corrupt sub-keys."""
    try:
        configmap = kube.get(CONFIGMAPS, namespace, items_name(key))
    except NotFound:
        return {}, []
    return decode_items(configmap.get("data") or {}, wanted)


def save_items(
    kube: KubeClient,
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


def read_ref(kube: KubeClient, namespace: str, ref: str, key: str) -> StoredResult:
    """The verified result a Done shard's `status.result.ref` names; StoreCorrupt when absent or bad."""
    try:
        configmap = kube.get(CONFIGMAPS, namespace, ref)
    except NotFound:
        raise StoreCorrupt(f"ConfigMap {ref} (the shard's result) does not exist") from None
    return check_result(configmap, key)


@dataclass
class ConfigMapStore:
    """The ConfigMap store bound to one namespace: the `ResultStore` the worker and the CLI use."""

    kube: KubeClient
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
        # Its callers (`store.finished.commit_for_reuse`) treat a failed commit as the store's
        # trouble: the shard is Done all the same. So API trouble here is StoreUnavailable, as the
        # S3 store's is, never an error that would take the worker or the operator's sweep off course.
        try:
            commit(self.kube, self.namespace, key, stored)
        except (ApiError, urllib3.exceptions.HTTPError, OSError) as error:
            raise StoreUnavailable(f"committing ConfigMap {result_name(key)}: {error}") from error

    def find_result(self, key: str, token: int | None, *, committed: bool = True) -> StoredResult | None:
        return find_result(self.kube, self.namespace, key, token, committed=committed)

    def read_ref(self, ref: str, key: str) -> StoredResult:
        return read_ref(self.kube, self.namespace, ref, key)

    def read_items(self, key: str, wanted: Iterable[str]) -> tuple[dict[str, ItemRecord], list[str]]:
        return read_items(self.kube, self.namespace, key, wanted)

    def save_items(
        self, key: str, campaign: str, records: Mapping[str, ItemRecord], shard: str, token: int
    ) -> int:
        return save_items(self.kube, self.namespace, key, campaign, records, self.max_bytes, shard=shard)
