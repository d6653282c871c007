"""Builders shared by the `kubectl campaign` tests (no tests here): campaigns and shards as the API
server returns them, and an in-memory stand-in for `shardops.k8s.api.Kube`."""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardops.api.names import API_GROUP_VERSION, CAMPAIGN_LABEL
from shardops.k8s.api import CAMPAIGNS, EVENTS, SHARDS, ApiError, Conflict, Forbidden, NotFound, Resource
from shardops.logic.timefmt import rfc3339

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
JSON = dict[str, Any]


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def t(seconds_ago: float) -> str:
    return rfc3339(ago(seconds_ago))


def campaign_body(
    name: str = "papers",
    namespace: str = "ns",
    *,
    items: int = 4,
    shard_size: int = 1,
    status: JSON | None = None,
    annotations: Mapping[str, str] | None = None,
    resource_version: str = "100",
    **spec: Any,
) -> JSON:
    body: JSON = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Campaign",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": resource_version,
            "creationTimestamp": t(3600),
        },
        "spec": {
            "items": [{"n": i} for i in range(items)],
            "shardSize": shard_size,
            "worker": {"image": "shardops:dev", "command": ["agent"]},
            **spec,
        },
    }
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    if status is not None:
        body["status"] = status
    return body


def history(
    *entries: tuple[str, str, float, int] | tuple[str, str, float, int, dict[str, Any]],
) -> list[JSON]:
    """(phase, reason, seconds ago, attempt[, extra fields]) -> status.history entries."""
    out = []
    for entry in entries:
        phase, reason, seconds, attempt = entry[:4]
        extra: dict[str, Any] = entry[4] if len(entry) > 4 else {}  # type: ignore[misc]
        out.append({"phase": phase, "at": t(seconds), "reason": reason, "attempt": attempt, **extra})
    return out


def shard_body(
    campaign: str,
    index: int,
    phase: str | None,
    *,
    namespace: str = "ns",
    attempt: int = 1,
    status: JSON | None = None,
    source: str | None = None,
    shard_class: str = "work",
    managers: Sequence[str] = ("shardops-operator",),
    uid: str | None = None,
) -> JSON:
    name = f"{campaign}-{index:05d}" if shard_class == "work" else f"{campaign}-finalize"
    spec: JSON = {
        "campaign": campaign,
        "index": index,
        "shardClass": shard_class,
        "idempotencyKey": f"key-{index}",
    }
    if shard_class == "work":
        spec["items"] = [{"n": index}]
        spec["itemRange"] = {"start": index, "end": index + 1}
    if source:
        spec["source"] = source
    body: JSON = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Shard",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "resourceVersion": "7",
            "labels": {CAMPAIGN_LABEL: campaign},
            "creationTimestamp": t(3000),
            "managedFields": [
                {"manager": "shardops-operator", "operation": "Update", "apiVersion": API_GROUP_VERSION},
                *(
                    {"manager": m, "operation": "Update", "subresource": "status", "time": t(60)}
                    for m in managers
                ),
            ],
        },
        "spec": spec,
    }
    if phase is not None:
        body["status"] = {"phase": phase, "attempt": attempt, **(status or {})}
    return body


def done_status(
    seconds_ago: float, *, attempt: int = 1, cost: float = 0.0, fingerprint: str = "sha256:ab"
) -> JSON:
    result = {"ref": "shardops-result-x", "fingerprint": fingerprint, "bytes": 10} if fingerprint else None
    status: JSON = {
        "cost": cost,
        "progress": {"done": 1, "total": 1},
        "history": history(
            ("Pending", "Materialized", seconds_ago + 20, 1),
            ("Running", "Claimed", seconds_ago + 10, attempt, {"owner": "w-1"}),
            ("Done", "Completed", seconds_ago, attempt, {"owner": "w-1"}),
        ),
    }
    if result:
        status["result"] = result
    return status


# --- an in-memory Kube --------------------------------------------------------------------------------


@dataclass
class Call:
    method: str
    path: str
    body: Any = None
    query: Mapping[str, Any] = field(default_factory=dict)


class FakeConfiguration:
    host = "https://fake.example:6443"


class FakeApiClient:
    configuration = FakeConfiguration()


@dataclass
class FakeKube:
    """Objects by (plural, namespace, name). `fail` makes calls raise: a function of the call that
    returns an exception or None. `served` lists the plurals the API group serves (CRDs installed)."""

    objects: dict[tuple[str, str, str], JSON] = field(default_factory=dict)
    served: set[str] = field(default_factory=lambda: {"campaigns", "shards"})
    fail: Callable[[Call], BaseException | None] = lambda call: None
    calls: list[Call] = field(default_factory=list)
    field_manager: str = "kubectl-campaign"
    api_client: FakeApiClient = field(default_factory=FakeApiClient)
    on_patch: Callable[[FakeKube, JSON], None] | None = None

    def add(self, resource: Resource, body: JSON) -> None:
        meta = body["metadata"]
        self.objects[(resource.plural, meta.get("namespace") or "", meta["name"])] = copy.deepcopy(body)

    def _record(self, call: Call) -> None:
        self.calls.append(call)
        problem = self.fail(call)
        if problem is not None:
            raise problem

    def request(self, method: str, path: str, *, query: Any = None, body: Any = None, **_: Any) -> JSON:
        self._record(Call(method, path, body, dict(query or {})))
        if path.startswith("/apis/shardops.dev/v1alpha1") and method == "GET":
            if not self.served:
                raise NotFound(404, "NotFound", "404 page not found")
            return {"resources": [{"name": p} for p in sorted(self.served)]}
        if path.endswith("selfsubjectreviews"):
            return {"status": {"userInfo": {"username": "alice"}}}
        raise AssertionError(f"unexpected request {method} {path}")

    def _served(self, resource: Resource) -> None:
        if resource in (CAMPAIGNS, SHARDS) and resource.plural not in self.served:
            raise NotFound(404, "NotFound", "404 page not found")

    def get(
        self, resource: Resource, namespace: str | None, name: str, subresource: str | None = None
    ) -> JSON:
        self._record(Call("GET", resource.path(namespace, name)))
        self._served(resource)
        try:
            return copy.deepcopy(self.objects[(resource.plural, namespace or "", name)])
        except KeyError:
            raise NotFound(404, "NotFound", f'{resource.plural} "{name}" not found') from None

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        **query: Any,
    ) -> list[JSON]:
        self._record(Call("LIST", resource.path(namespace), query={"labelSelector": label_selector, **query}))
        self._served(resource)
        found = []
        for (plural, ns, _), body in sorted(self.objects.items()):
            if plural != resource.plural or (namespace and ns != namespace):
                continue
            if label_selector:
                labels = body["metadata"].get("labels") or {}
                key, _, value = label_selector.partition(",")[0].partition("=")
                if labels.get(key) != value:
                    continue
            selector = query.get("fieldSelector")
            if selector:
                key, _, value = str(selector).partition("=")
                if (body.get("regarding") or {}).get(key.split(".")[-1]) != value:
                    continue
            found.append(copy.deepcopy(body))
        return found

    def create(self, resource: Resource, namespace: str | None, body: JSON) -> JSON:
        self._record(Call("POST", resource.path(namespace), body))
        self.add(resource, {**body, "metadata": {**body["metadata"], "namespace": namespace}})
        return copy.deepcopy(body)

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
        self._record(
            Call("PATCH", resource.path(namespace, name, subresource), patch, {"rv": resource_version})
        )
        key = (resource.plural, namespace or "", name)
        if key not in self.objects:
            raise NotFound(404, "NotFound", f'{resource.plural} "{name}" not found')
        current = self.objects[key]
        if resource_version is not None and current["metadata"].get("resourceVersion") != resource_version:
            raise Conflict(409, "Conflict", "the object has been modified")
        merged = merge(current, patch)
        merged["metadata"]["resourceVersion"] = str(int(current["metadata"].get("resourceVersion") or 0) + 1)
        self.objects[key] = merged
        if self.on_patch is not None:
            self.on_patch(self, merged)
        return copy.deepcopy(merged)

    def delete(self, resource: Resource, namespace: str | None, name: str, **_: Any) -> JSON:
        self._record(Call("DELETE", resource.path(namespace, name)))
        self.objects.pop((resource.plural, namespace or "", name), None)
        return {}

    def events(self) -> list[JSON]:
        return [b for (plural, _, _), b in self.objects.items() if plural == EVENTS.plural]

    def writes(self) -> list[Call]:
        return [
            c
            for c in self.calls
            if c.method in ("PATCH", "POST", "DELETE") and "selfsubjectreviews" not in c.path
        ]


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def forbidden(call: Call) -> BaseException:
    return Forbidden(
        403, "Forbidden", f'cannot {call.method.lower()} at {call.path}: User "bob" is forbidden'
    )


def unauthorized(call: Call) -> BaseException:
    return ApiError(401, "Unauthorized", "Unauthorized")


def dumps(body: JSON) -> str:
    return json.dumps(body)
