"""What every result store holds, independent of where: item records, shard results, their checks.

Pure: building and verifying the bytes a store keeps. A shard result is canonical JSON, so its
bytes (and its SHA-256 fingerprint) depend on the content only; a reader trusts a stored result
only when its fingerprint and length check, so a half-written or edited result is recomputed,
never returned.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from shardops.api.enums import ErrorClass
from shardops.api.money import JsonNumber, money_text, parse_money
from shardops.logic.idempotency import canonical_json, fingerprint, key_label

_SHA256 = "sha256:"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_MAX = 63


class ResultTooLarge(Exception):
    """The result does not fit the store. Not retryable: the same input gives the same size."""

    error_class = ErrorClass.RESULT_TOO_LARGE


class StoreCorrupt(Exception):
    """An entry is present but does not verify; it is treated as absent and recomputed."""


class StoreUnavailable(Exception):
    """The store cannot be reached or refuses us (endpoint, bucket, credentials): retried, and named
    in the campaign's conditions when it lasts."""


@dataclass(frozen=True)
class ItemRecord:
    """One item's result as the command reported it."""

    result: Any
    cost: Decimal = Decimal(0)

    def encode(self) -> str:
        return canonical_json(
            {"cost": money_text(self.cost), "fingerprint": fingerprint(self.result), "result": self.result}
        )


def decode_item(raw: str | bytes) -> ItemRecord | None:
    """An encoded ItemRecord if it verifies (its result matches its fingerprint), else None."""
    try:
        value = json.loads(raw, parse_float=JsonNumber)
        if not isinstance(value, dict) or "result" not in value:
            return None
        if value.get("fingerprint") != fingerprint(value["result"]):
            return None
        # Costs are decimal strings; records written before were JSON numbers (read from their text).
        return ItemRecord(value["result"], parse_money(value.get("cost", 0)))
    except (ValueError, TypeError):
        return None


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
    """Who wrote a result: recorded with it for audits, never used to decide anything."""

    campaign: str
    shard: str
    owner: str
    attempt: int
    # The Lease's fencing token of the writing claim: names the attempt's object in the S3 store.
    token: int = 0


def store_label(key: str) -> str:
    """A label value / DNS label for an idempotency key, whatever form the operator wrote it in."""
    if key.startswith(_SHA256):
        return key_label(key)
    if len(key) <= _LABEL_MAX and _DNS_LABEL.match(key):
        return key
    return key_label(fingerprint(key))


def sha256_of(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return _SHA256 + hashlib.sha256(data).hexdigest()


def encode_result(
    key: str, entries: Sequence[tuple[int, str, Any]], costs: Mapping[str, Decimal] | None = None
) -> str:
    """The shard result: canonical JSON, so its bytes (and fingerprint) depend on the content only.

    `entries` are (index in shard, item sub-key, result), one per item, in index order; `costs`, by
    sub-key, what each item cost when it was computed (`kubectl campaign results` reports it).
    """
    rows = []
    for index, subkey, result in entries:
        row: dict[str, Any] = {"index": index, "key": subkey, "result": result}
        if costs is not None and subkey in costs:
            row["cost"] = money_text(costs[subkey])
        rows.append(row)
    return canonical_json({"idempotencyKey": key, "items": rows})


def check_document(text: str, key: str, where: str) -> None:
    """StoreCorrupt unless `text` is the result document of `key`."""
    try:
        stored_key = json.loads(text).get("idempotencyKey")
    except (json.JSONDecodeError, AttributeError):
        raise StoreCorrupt(f"{where} is not a result document") from None
    if stored_key != key:
        # Two keys sharing a 224-bit label prefix would land here; so would a hand-made object.
        raise StoreCorrupt(f"{where} holds the result of {stored_key!r}, not {key!r}")


def encode_pointer(key: str, stored: StoredResult) -> str:
    """A key's committed result: a small document naming the object one claim stored (`stored`),
    written once after that claim's fenced Done write."""
    return canonical_json(
        {"idempotencyKey": key, "ref": stored.name, "fingerprint": stored.fingerprint, "bytes": stored.bytes}
    )


def follow_pointer(text: str | bytes, where: str, read_ref: Callable[[str], StoredResult]) -> StoredResult:
    """The verified result the pointer `text` (at `where`) names, read with `read_ref`; StoreCorrupt
    when `text` is not a pointer or the object it names is not the result it committed."""
    try:
        target = json.loads(text)
        ref = str(target["ref"])
    except (ValueError, KeyError, TypeError):
        raise StoreCorrupt(f"{where} is not a result pointer") from None
    stored = read_ref(ref)
    if stored.fingerprint != target.get("fingerprint"):
        raise StoreCorrupt(f"{ref} is not the result {where} committed")
    return stored


def check_size(what: str, size: int, cap: int, fix: str) -> None:
    if size > cap:
        raise ResultTooLarge(
            f"{what} take {size} bytes, over the result size cap of {cap} bytes ({fix}): nothing was "
            "stored. Use a smaller spec.shardSize or make the command's results smaller"
        )
