"""Idempotency keys: decided by the input alone, so every retry finds the result the last one stored.

Canonical JSON follows RFC 8785 (JCS) where it matters for stability: sorted keys, no whitespace,
UTF-8 text, and one spelling per number (1.0 and 1 are the same JSON number). Keys are sorted by
code point, not UTF-16 unit, which only differs for astral characters and is stable either way.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence

# Integral floats beyond 2**53 are not exact integers; they keep their float spelling.
_EXACT_INT_LIMIT = 2**53
_PREFIX = "sha256:"
# A label value and a DNS-1123 label are both at most 63 characters.
_LABEL_MAX = 63
_LABEL_PREFIX = "sha256-"


def canonical_json(obj: object) -> str:
    """Raises TypeError/ValueError on what JSON cannot say exactly (non-str keys, NaN, sets, ...)."""
    return json.dumps(
        _normalize(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _normalize(obj: object) -> object:
    if isinstance(obj, bool) or obj is None or isinstance(obj, str | int):
        return obj
    if isinstance(obj, float):
        return _normalize_float(obj)
    if isinstance(obj, bytes | bytearray):
        raise TypeError("bytes are not JSON data: decode or base64 them first")
    if isinstance(obj, Mapping):
        return {_key(k): _normalize(v) for k, v in obj.items()}
    if isinstance(obj, Sequence):
        return [_normalize(v) for v in obj]
    raise TypeError(f"not JSON data: {type(obj).__name__}")


def _normalize_float(value: float) -> float | int:
    if not math.isfinite(value):
        raise ValueError(f"{value} has no JSON form")
    if value.is_integer() and abs(value) < _EXACT_INT_LIMIT:
        return int(value)
    return value


def _key(key: object) -> str:
    # json.dumps would turn 1 into "1" silently, making {1: x} and {"1": x} collide.
    if not isinstance(key, str):
        raise TypeError(f"JSON object keys must be strings, got {key!r}")
    return key


def fingerprint(obj: object) -> str:
    """`sha256:<64 hex>` of the canonical JSON."""
    digest = hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()
    return _PREFIX + digest


def idempotency_key(campaign_name: str, shard_input: object, worker_identity: object) -> str:
    """Same key on every retry of the same work; any change of campaign, input or worker changes it.

    `worker_identity` is the JSON data of what decides the worker's results
    (`api.campaign.WorkerSpec.identity`: image, command, env, ...), taken canonically: mapping order
    does not matter, list order does, and a string is one value, not a list of characters.
    """
    key_input = {"campaign": campaign_name, "input": fingerprint(shard_input), "worker": worker_identity}
    return fingerprint(key_input)


def key_label(key: str) -> str:
    """A 63-character form of a key, valid as a label value and as a DNS-1123 name (224 bits kept)."""
    if not key.startswith(_PREFIX):
        raise ValueError(f"not a shardops key: {key!r}")
    return (_LABEL_PREFIX + key.removeprefix(_PREFIX))[:_LABEL_MAX]


def item_subkey(item: object) -> str:
    """Results inside a shard are keyed by item fingerprint, so a partial run resumes item by item."""
    return fingerprint(item)


def items_digest(items: Iterable[object]) -> str:
    """`sha256:<64 hex>` over the items in order, one canonical JSON line each: what a closing step
    that reads every result depends on. Streams (one item in memory at a time)."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(canonical_json(item).encode("utf-8"))
        digest.update(b"\n")
    return _PREFIX + digest.hexdigest()
