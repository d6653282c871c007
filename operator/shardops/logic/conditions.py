"""metav1.Condition handling with apimachinery's SetStatusCondition semantics, and change detection.

lastTransitionTime moves only when a condition's status flips, so `kubectl get` ages stay truthful
and an unchanged status produces no write at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from shardops.logic.idempotency import canonical_json
from shardops.logic.timefmt import parse_rfc3339, rfc3339


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Condition:
    """A desired condition leaves the two bookkeeping fields None; `merge_conditions` fills them."""

    type: str
    status: ConditionStatus
    reason: str
    message: str
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


def merge_conditions(
    old: Sequence[Condition], new: Sequence[Condition], now: datetime, generation: int
) -> tuple[Condition, ...]:
    """Sets each new condition by type; conditions of other types are kept as they were."""
    merged = list(old)
    for desired in new:
        position = next((i for i, c in enumerate(merged) if c.type == desired.type), None)
        if position is None:
            merged.append(replace(desired, last_transition_time=now, observed_generation=generation))
            continue
        previous = merged[position]
        unchanged = previous.status == desired.status and previous.last_transition_time is not None
        since = previous.last_transition_time if unchanged else now
        merged[position] = replace(desired, last_transition_time=since, observed_generation=generation)
    return tuple(merged)


def condition_to_dict(condition: Condition) -> dict[str, object]:
    if condition.last_transition_time is None:
        raise ValueError(f"condition {condition.type} has no lastTransitionTime: merge it first")
    out: dict[str, object] = {
        "type": condition.type,
        "status": str(condition.status),
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": rfc3339(condition.last_transition_time),
    }
    if condition.observed_generation is not None:
        out["observedGeneration"] = condition.observed_generation
    return out


def condition_from_dict(data: Mapping[str, object]) -> Condition:
    stamp = data.get("lastTransitionTime")
    generation = data.get("observedGeneration")
    return Condition(
        type=str(data["type"]),
        status=ConditionStatus(str(data["status"])),
        reason=str(data.get("reason", "")),
        message=str(data.get("message", "")),
        last_transition_time=parse_rfc3339(stamp) if isinstance(stamp, str) else None,
        observed_generation=generation if isinstance(generation, int) else None,
    )


def status_changed(old: Mapping[str, object] | None, new: Mapping[str, object]) -> bool:
    """Would a merge patch of `new` change anything? Keys `new` does not set are not ours to compare.

    Compared as canonical JSON, so key order and 1 vs 1.0 are not changes; a key set to None
    (a delete in a merge patch) equals a missing one.
    """
    before = old or {}
    return any(canonical_json(before.get(key)) != canonical_json(value) for key, value in new.items())
