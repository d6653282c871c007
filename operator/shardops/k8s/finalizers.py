"""Removing one finalizer from an object without touching anyone else's.

A merge patch can only replace `metadata.finalizers` whole, which would drop a finalizer another
controller added between our read and our write. A JSON patch removes the entry by index, and a
`test` of that index first makes the server refuse the patch (422) when the list moved meanwhile;
then the object is read again and the removal recomputed. Building the patch is pure
(`removal_patch`); `remove_finalizer` is the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardops.api.common import JSON
from shardops.k8s.api import Invalid, KubeClient, NotFound, Resource

# Rounds of read-and-patch when the list keeps changing under us; the next event retries anyway.
REMOVAL_ROUNDS = 3


def finalizers_of(body: Mapping[str, Any]) -> list[str]:
    return [str(entry) for entry in (body.get("metadata") or {}).get("finalizers") or []]


def removal_patch(finalizers: Sequence[str], finalizer: str) -> list[JSON]:
    """JSON patch ops removing every `finalizer` entry of the list, each after a test that the entry
    at that index is still `finalizer`. Highest index first, so earlier indexes do not shift.
    Empty when the list does not carry it."""
    ops: list[JSON] = []
    for index in reversed([i for i, entry in enumerate(finalizers) if entry == finalizer]):
        path = f"/metadata/finalizers/{index}"
        ops += [{"op": "test", "path": path, "value": finalizer}, {"op": "remove", "path": path}]
    return ops


def remove_finalizer(
    kube: KubeClient,
    resource: Resource,
    namespace: str,
    name: str,
    finalizer: str,
    *,
    body: Mapping[str, Any] | None = None,
) -> bool:
    """Remove `finalizer` from the object, keeping every other entry. `body` is the object as last
    seen (saves a read). True when this call removed it; False when it was not there or the object
    is gone. Raises Invalid if the list changed under every one of REMOVAL_ROUNDS attempts."""
    current: Mapping[str, Any] | None = body
    for round_ in range(REMOVAL_ROUNDS):
        try:
            if current is None:
                current = kube.get(resource, namespace, name)
            ops = removal_patch(finalizers_of(current), finalizer)
            if not ops:
                return False
            kube.json_patch(resource, namespace, name, ops)
            return True
        except NotFound:
            return False
        except Invalid:
            # A test op failed: the list is not what we read. Read again and recompute.
            if round_ == REMOVAL_ROUNDS - 1:
                raise
            current = None
    return False  # pragma: no cover - the loop returns or raises
