"""An in-memory API server for worker and result-store tests, and builders for campaigns and shards.

`FakeKube` has the `Kube` methods the worker uses (get, list, create, replace, patch, delete) with
the semantics that matter for fencing: resourceVersions that change on every write, preconditions
that fail with Conflict, AlreadyExists on create, JSON merge patch (RFC 7386) and the status
subresource. `before` hooks let a test act as another writer at an exact point of the protocol.
The tests at the bottom keep the fake honest.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from shardops.api.names import CAMPAIGN_LABEL
from shardops.api.shard import Shard
from shardops.k8s.api import (
    CAMPAIGNS,
    SHARDS,
    AlreadyExists,
    Conflict,
    NotFound,
    Resource,
)
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.logic.idempotency import idempotency_key
from shardops.logic.transitions import Action

JSON = dict[str, Any]
Hook = Callable[["FakeKube", str, Resource, str], None]


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], JSON] = {}
        self._versions = itertools.count(1)
        self.writes: list[tuple[str, str, str, int]] = []
        # Called before a write: (kube, verb, resource, name); may raise or change objects.
        self.before: list[Hook] = []

    # --- helpers for tests -------------------------------------------------------------------------

    def obj(self, resource: Resource, namespace: str, name: str) -> JSON | None:
        return self.objects.get((resource.plural, namespace, name))

    def put(self, resource: Resource, namespace: str, body: JSON) -> JSON:
        """Store as the API server would, bypassing hooks (test setup)."""
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[(resource.plural, namespace, meta["name"])] = body
        return copy.deepcopy(body)

    def _hooks(self, verb: str, resource: Resource, name: str) -> None:
        for hook in list(self.before):
            hook(self, verb, resource, name)

    def _record(self, verb: str, resource: Resource, name: str, code: int) -> None:
        self.writes.append((verb, resource.plural, name, code))

    def writes_to(
        self, plural: str, name: str | None = None, ok: bool = True
    ) -> list[tuple[str, str, str, int]]:
        return [
            w
            for w in self.writes
            if w[1] == plural and (name is None or w[2] == name) and ((w[3] < 300) == ok)
        ]

    # --- the Kube surface ----------------------------------------------------------------------------

    def get(
        self, resource: Resource, namespace: str | None, name: str, subresource: str | None = None
    ) -> JSON:
        found = self.obj(resource, namespace or "", name)
        if found is None:
            raise NotFound(404, "NotFound", f"{resource.plural} {name} not found")
        return copy.deepcopy(found)

    def list(
        self, resource: Resource, namespace: str | None = None, label_selector: str | None = None
    ) -> list[JSON]:
        wanted = dict(part.split("=", 1) for part in label_selector.split(",")) if label_selector else {}
        found = []
        for (plural, ns, _), body in sorted(self.objects.items()):
            if plural != resource.plural or (namespace and ns != namespace):
                continue
            labels = body.get("metadata", {}).get("labels") or {}
            if all(labels.get(k) == v for k, v in wanted.items()):
                found.append(copy.deepcopy(body))
        return found

    def create(self, resource: Resource, namespace: str | None, body: JSON) -> JSON:
        name = body["metadata"]["name"]
        self._hooks("create", resource, name)
        if self.obj(resource, namespace or "", name) is not None:
            self._record("create", resource, name, 409)
            raise AlreadyExists(409, "AlreadyExists", f"{resource.plural} {name} already exists")
        stored = copy.deepcopy(body)
        stored.pop("status", None) if resource is SHARDS else None
        self._record("create", resource, name, 201)
        return self.put(resource, namespace or "", stored)

    def replace(self, resource: Resource, namespace: str | None, name: str, body: JSON) -> JSON:
        self._hooks("replace", resource, name)
        current = self.obj(resource, namespace or "", name)
        if current is None:
            self._record("replace", resource, name, 404)
            raise NotFound(404, "NotFound", name)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            self._record("replace", resource, name, 409)
            raise Conflict(409, "Conflict", f"{name}: the object has been modified")
        stored = copy.deepcopy(body)
        stored["metadata"] = {**current["metadata"], **stored["metadata"]}
        self._record("replace", resource, name, 200)
        return self.put(resource, namespace or "", stored)

    def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: JSON,
        *,
        resource_version: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        self._hooks("patch", resource, name)
        current = self.obj(resource, namespace or "", name)
        if current is None:
            self._record("patch", resource, name, 404)
            raise NotFound(404, "NotFound", name)
        if resource_version is not None and resource_version != current["metadata"]["resourceVersion"]:
            self._record("patch", resource, name, 409)
            raise Conflict(409, "Conflict", f"{name}: the object has been modified")
        body = copy.deepcopy(patch)
        body.pop("metadata", None) if subresource == "status" else None
        if subresource == "status":
            body = {"status": body.get("status")}
        elif resource in (SHARDS, CAMPAIGNS):
            body.pop("status", None)
        merged = merge_patch(current, body)
        merged["metadata"] = current["metadata"]
        self._record("patch", resource, name, 200)
        return self.put(resource, namespace or "", merged)

    def delete(self, resource: Resource, namespace: str | None, name: str, **_: Any) -> JSON:
        self.objects.pop((resource.plural, namespace or "", name), None)
        return {}


# --- builders -------------------------------------------------------------------------------------

NAMESPACE = "ns"
OPERATOR = Actor("shardops.dev/operator", "test")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def campaign_body(name: str = "camp", items: list[JSON] | None = None, **spec: Any) -> JSON:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": name},
        "spec": {
            "items": items if items is not None else [{"id": i} for i in range(4)],
            "shardSize": 2,
            "leaseSeconds": 10,
            "heartbeatSeconds": 1,
            "idleSeconds": 0,
            "worker": {"image": "x", "command": ["true"]},
            **spec,
        },
    }


def add_campaign(kube: FakeKube, body: JSON) -> list[Shard]:
    """The Campaign and its shards in Pending, as the operator makes them."""
    kube.put(CAMPAIGNS, NAMESPACE, body)
    name = body["metadata"]["name"]
    size = body["spec"]["shardSize"]
    items = body["spec"]["items"]
    command = body["spec"]["worker"]["command"]
    shards = []
    for index, start in enumerate(range(0, len(items), size)):
        part = items[start : start + size]
        created = kube.put(
            SHARDS,
            NAMESPACE,
            {
                "apiVersion": "shardops.dev/v1alpha1",
                "kind": "Shard",
                "metadata": {"name": f"{name}-{index:05d}", "labels": {CAMPAIGN_LABEL: name}},
                "spec": {
                    "campaign": name,
                    "index": index,
                    "items": part,
                    "idempotencyKey": idempotency_key(name, part, command),
                },
            },
        )
        shards.append(
            apply_transition(
                kube,  # type: ignore[arg-type]
                Shard.parse(created),
                TransitionRequest(Action.MATERIALIZE, "test"),
                OPERATOR,
                T0,
            )
        )
    return shards


# --- the fake's own tests ---------------------------------------------------------------------------


def test_merge_patch_follows_rfc_7386() -> None:
    assert merge_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}, "f": [1]}) == {
        "a": 1,
        "b": {"d": 3, "e": 4},
        "f": [1],
    }


def test_fake_enforces_preconditions_and_bumps_versions() -> None:
    kube = FakeKube()
    created = kube.create(
        SHARDS, NAMESPACE, {"metadata": {"name": "s"}, "spec": {}, "status": {"phase": "X"}}
    )
    assert "status" not in created
    with pytest.raises(AlreadyExists):
        kube.create(SHARDS, NAMESPACE, {"metadata": {"name": "s"}})
    patched = kube.patch(
        SHARDS, NAMESPACE, "s", {"status": {"phase": "Pending"}}, resource_version="1", subresource="status"
    )
    assert patched["status"] == {"phase": "Pending"} and patched["metadata"]["resourceVersion"] != "1"
    with pytest.raises(Conflict):
        kube.patch(SHARDS, NAMESPACE, "s", {"status": {}}, resource_version="1", subresource="status")
    unchanged = kube.patch(SHARDS, NAMESPACE, "s", {"status": {"phase": "Done"}})
    assert unchanged["status"] == {"phase": "Pending"}, "the main resource ignores status"


def test_add_campaign_materializes_pending_shards() -> None:
    kube = FakeKube()
    shards = add_campaign(kube, campaign_body(items=[{"id": i} for i in range(5)]))
    assert [s.name for s in shards] == ["camp-00000", "camp-00001", "camp-00002"]
    assert {s.phase for s in shards} == {"Pending"} and {s.current_status.attempt for s in shards} == {1}
