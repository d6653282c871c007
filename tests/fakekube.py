"""One in-memory API server for the unit tests: a stand-in for `shardops.k8s.api.Kube`.

`FakeKube` has the calls the product makes on a client (`shardops.k8s.api.KubeClient`, which `Kube`
satisfies too; mypy checks the fake against it: the end of this file) with the semantics that
matter for fencing and for what the tests assert, as the real API server has them:

* objects by (plural, namespace, name); one resourceVersion counter for all of them, bumped on
  every write, continuing above any version a test seeds;
* preconditions (`resource_version`, a PUT body's or a DELETE's resourceVersion) fail with
  `Conflict`; create fails with `AlreadyExists`; reads and writes of missing objects with `NotFound`;
* create names objects from `metadata.generateName` and returns the stored object;
* JSON patch (RFC 6902 `test`, `remove`, `add`; `json_patch_ops`): a failed test or a
  missing path is `Invalid` (422), as the API server answers;
* JSON merge patch (RFC 7386, `merge_patch`) and the status subresource: Campaigns and Shards
  ignore `status` on the main resource (create, replace, patch) and a status write changes only
  `status`; server-owned metadata (name, namespace, uid, creationTimestamp) is never overwritten;
* label selectors (`k=v`, `k!=v`, `k`, `!k`, comma-joined) and field selectors on dotted paths;
* discovery of the shardops API group (`served`) and a SelfSubjectReview answered as `username`;
* `list_at` and `watch`: every write (and delete) is logged with its version, and a watch from a
  version yields the later changes its selectors see — ADDED, MODIFIED, or DELETED also when an
  object stops matching a field selector, as the API server's watch cache sends them — blocking
  (thread-safe) for new ones until its `seconds` pass.

A `write_guard`, as `Kube`'s, is called as `(method, path)` before each write and may refuse it
(WriteRefused): a refused write was never sent, so it is neither recorded nor hooked.

Every call is recorded in `calls` (a `Call` with its outcome status). Three hook points: `fail`, a
function of each call that returns an exception to raise (or None), and `before`, functions
called as `(kube, verb, resource, name)` before each write, to act as another writer at an exact
point of the protocol (they may change objects with `put`, or raise); and `lose_answers`, which
applies the next matching writes and answers them with an error instead (the ambiguous outcome:
committed, then a 504, a read timeout, or the 409 that `Kube`'s retry of it meets). Test setup goes through
`add` (store a body as the API server returned it, its resourceVersion kept) or `put` (store as a
write would, with a new resourceVersion); neither is recorded nor runs hooks.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import urllib3
from testbed.faults.history import merge_patch

from shardops.api.common import JSON
from shardops.k8s.api import (
    CAMPAIGNS,
    CLUSTER_SOURCES,
    DEFAULT_TIMEOUT_SECONDS,
    EVENTS,
    SHARDS,
    SOURCES,
    AlreadyExists,
    ApiError,
    Conflict,
    Invalid,
    KubeClient,
    NotFound,
    Resource,
    WatchEvent,
    WriteGuard,
)

Hook = Callable[["FakeKube", str, Resource, str], None]
# What a committed write is answered with instead of its result.
LostAnswer = Callable[["Call"], BaseException]
WriteEntry = tuple[str, str, str, int]

# Resources served with a status subresource: their main resource ignores `status`.
WITH_STATUS_SUBRESOURCE = (CAMPAIGNS, SHARDS, SOURCES, CLUSTER_SOURCES)
# Metadata the API server owns: no write changes it.
SERVER_OWNED = ("name", "namespace", "uid", "creationTimestamp")
VERBS = {"POST": "create", "PUT": "replace", "PATCH": "patch", "DELETE": "delete"}
API_GROUP_PATH = "/apis/shardops.dev/v1alpha1"


def json_patch_ops(target: Any, ops: Sequence[JSON]) -> Any:
    """RFC 6902 `test`, `remove` and `add` (`-` appends to a list) on a copy of `target`. A failed
    test or a missing path raises Invalid, and nothing changes."""
    result = copy.deepcopy(target)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        try:
            container = result
            for part in parents:
                container = container[int(part)] if isinstance(container, list) else container[part]
            if isinstance(container, list):
                key: Any = len(container) if last == "-" else int(last)
                if not 0 <= key <= len(container) - (op["op"] != "add"):
                    raise IndexError(key)
            else:
                key = last
            if op["op"] == "test" and container[key] != op["value"]:
                raise Invalid(422, "Invalid", f"the test of {op['path']} failed")
            if op["op"] == "remove":
                del container[key]
            elif op["op"] == "add" and isinstance(container, list):
                container.insert(key, copy.deepcopy(op["value"]))
            elif op["op"] == "add":
                container[key] = copy.deepcopy(op["value"])
        except (KeyError, IndexError, ValueError, TypeError):
            raise Invalid(422, "Invalid", f"{op['op']} {op['path']}: no such path") from None
    return result


@dataclass
class Call:
    """One call as the fake saw it. `verb` (create, replace, patch, delete) is set for writes of a
    resource; `status` is the answer's HTTP status (0 when no answer came: a connection error)."""

    method: str
    path: str
    body: Any = None
    query: Mapping[str, Any] = field(default_factory=dict)
    verb: str | None = None
    plural: str = ""
    name: str = ""
    status: int = 200

    @property
    def entry(self) -> WriteEntry:
        return (self.verb or "", self.plural, self.name, self.status)


class FakeConfiguration:
    host = "https://fake.example:6443"


class FakeApiClient:
    def __init__(self) -> None:
        self.configuration = FakeConfiguration()
        self.user_agent = "fake"


def retried_into_itself(call: Call) -> BaseException:
    """What `Kube` raises when a write committed, was answered 504, and its retry met the write
    itself: AlreadyExists for a create, Conflict for a write at a resourceVersion."""
    if call.verb == "create":
        return AlreadyExists(
            409, "AlreadyExists", f"{call.plural} {call.name!r} already exists", ambiguous=True
        )
    return Conflict(
        409, "Conflict", f"{call.plural} {call.name!r}: the object has been modified", ambiguous=True
    )


def gateway_timeout(call: Call) -> BaseException:
    """A 504 to the end of `Kube`'s retries, the first of which committed."""
    return ApiError(504, "Timeout", "the server was unable to return a response in time", ambiguous=True)


def read_timeout(call: Call) -> BaseException:
    """No answer within the client's timeout (not retried by `Kube`)."""
    return urllib3.exceptions.ReadTimeoutError(None, call.path, "Read timed out.")  # type: ignore[arg-type]


LOST_ANSWERS: dict[str, LostAnswer] = {
    "504 then 409": retried_into_itself,
    "504": gateway_timeout,
    "read timeout": read_timeout,
}


def _not_found(resource: Resource, name: str) -> NotFound:
    """As the API server answers for a missing object: a Status naming its kind and name."""
    message = f'{resource.plural} "{name}" not found'
    details = {"name": name, "group": resource.group, "kind": resource.plural}
    body = {
        "kind": "Status",
        "status": "Failure",
        "reason": "NotFound",
        "message": message,
        "details": details,
    }
    return NotFound(404, "NotFound", message, body)


def _status_kept(resource: Resource, current: JSON, written: JSON) -> JSON:
    """`written`, a new body for the main resource, as stored: on a resource with a status
    subresource its status stays what it was (only writes to /status change it)."""
    if resource in WITH_STATUS_SUBRESOURCE:
        written.pop("status", None)
        if "status" in current:
            written["status"] = copy.deepcopy(current["status"])
    return written


def _conflict(resource: Resource, name: str) -> Conflict:
    return Conflict(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource.plural} "{name}": the object has been modified',
    )


# A set-based term `key in (a,b)`: its values hold commas, so terms are split around it.
_SET_TERM = re.compile(r"([^,\s]+)\s+in\s+\(([^)]*)\)")


def _selected(labels: Mapping[str, str], selector: str) -> bool:
    for key, values in _SET_TERM.findall(selector):
        if labels.get(key) not in {value.strip() for value in values.split(",")}:
            return False
    selector = _SET_TERM.sub("", selector)
    for term in filter(None, (part.strip() for part in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field(body: JSON, path: str) -> Any:
    found: Any = body
    for part in path.split("."):
        found = found.get(part) if isinstance(found, dict) else None
    return found


def _fields_selected(body: JSON, selector: str) -> bool:
    for term in filter(None, (part.strip() for part in selector.split(","))):
        negate = "!=" in term
        key, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        found = _field(body, key)
        # The API server compares a missing field as the empty string.
        if (("" if found is None else str(found)) == value) == negate:
            return False
    return True


class FakeKube:
    def __init__(
        self,
        *,
        served: set[str] | None = None,
        fail: Callable[[Call], BaseException | None] | None = None,
        field_manager: str = "shardops-test",
        username: str = "alice",
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.objects: dict[tuple[str, str, str], JSON] = {}
        # The plurals of the shardops API group that are served (its CRDs installed).
        self.served: set[str] = {"campaigns", "shards"} if served is None else served
        self.fail: Callable[[Call], BaseException | None] = fail or (lambda call: None)
        self.before: list[Hook] = []
        # (which writes, answered how, how many more): see lose_answers.
        self._lost: list[tuple[Callable[[Call], bool], LostAnswer, list[int]]] = []
        self.calls: list[Call] = []
        self.field_manager = field_manager
        self.username = username
        self.timeout = timeout  # as Kube's: what a "no answer in time" message names
        self.write_guard: WriteGuard | None = None
        self.api_client = FakeApiClient()
        self._last_version = 0
        self._suffixes = itertools.count(1)
        # Every change as (version, plural, namespace, before, after), for watches; guarded with
        # the objects by one lock, since a watching thread reads while the test writes.
        self._changes: list[tuple[int, str, str, JSON | None, JSON | None]] = []
        self._changed = threading.Condition(threading.RLock())

    # --- test setup and inspection (not recorded, no hooks) ----------------------------------------

    def obj(self, resource: Resource, namespace: str, name: str) -> JSON | None:
        """The stored object itself (not a copy), or None."""
        return self.objects.get((resource.plural, namespace, name))

    def add(self, resource: Resource, body: JSON) -> None:
        """Store `body` as the API server returned it: its namespace and resourceVersion kept."""
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        version = str(meta.get("resourceVersion") or "")
        if version.isdigit():
            self._last_version = max(self._last_version, int(version))
        else:
            meta["resourceVersion"] = self._next_version()
        self.objects[(resource.plural, meta.get("namespace") or "", meta["name"])] = body

    def put(self, resource: Resource, namespace: str, body: JSON) -> JSON:
        """Store as a write would: in `namespace`, with a new resourceVersion."""
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        with self._changed:
            meta["resourceVersion"] = self._next_version()
            key = (resource.plural, namespace, meta["name"])
            self._log_change(key, self.objects.get(key), body)
            self.objects[key] = body
        return copy.deepcopy(body)

    def _log_change(self, key: tuple[str, str, str], before: JSON | None, after: JSON | None) -> None:
        """Called with the lock held, after the version was bumped."""
        self._changes.append(
            (self._last_version, key[0], key[1], copy.deepcopy(before), copy.deepcopy(after))
        )
        self._changed.notify_all()

    def _next_version(self) -> str:
        self._last_version += 1
        return str(self._last_version)

    def lose_answers(
        self, match: Callable[[Call], bool], answer: LostAnswer, times: int = 1, skip: int = 0
    ) -> list[Call]:
        """Apply the writes that `match` (after the first `skip` of them, the next `times`) and answer
        each with `answer(call)` instead of its result. Returns the calls so answered, as they
        happen."""
        answered: list[Call] = []
        counts = [skip, times]

        def record(call: Call) -> bool:
            if not match(call):
                return False
            if counts[0] > 0:
                counts[0] -= 1
                return False
            if counts[1] <= 0:
                return False
            counts[1] -= 1
            answered.append(call)
            return True

        self._lost.append((record, answer, counts))
        return answered

    def events(self) -> list[JSON]:
        return [body for (plural, _, _), body in self.objects.items() if plural == EVENTS.plural]

    def writes(self) -> list[Call]:
        """Every write call, answered or refused, in order."""
        return [call for call in self.calls if call.verb is not None]

    def write_log(self) -> list[WriteEntry]:
        """The writes as (verb, plural, name, status)."""
        return [call.entry for call in self.writes()]

    def writes_to(self, plural: str, name: str | None = None, ok: bool = True) -> list[WriteEntry]:
        return [
            entry
            for entry in self.write_log()
            if entry[1] == plural and (name is None or entry[2] == name) and ((200 <= entry[3] < 300) == ok)
        ]

    # --- recording and hooks -----------------------------------------------------------------------

    @contextmanager
    def _call(
        self,
        method: str,
        resource: Resource,
        namespace: str | None,
        name: str | None = None,
        *,
        subresource: str | None = None,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
    ) -> Iterator[Call]:
        call = Call(
            method,
            resource.path(namespace, name, subresource),
            body,
            dict(query or {}),
            verb=VERBS.get(method),
            plural=resource.plural,
            name=name or "",
        )
        if call.verb is not None and self.write_guard is not None:
            self.write_guard(method, call.path)
        try:
            if call.verb is not None:
                for hook in list(self.before):
                    hook(self, call.verb, resource, call.name)
        except BaseException as error:
            self._answered(call, error)
            raise
        self.calls.append(call)
        try:
            problem = self.fail(call)
            if problem is not None:
                raise problem
            if resource in (CAMPAIGNS, SHARDS) and resource.plural not in self.served:
                raise NotFound(404, "NotFound", "404 page not found")
            yield call
            if call.verb is not None:
                for selected, answer, _ in self._lost:
                    if selected(call):
                        raise answer(call)
        except BaseException as error:
            call.status = error.status if isinstance(error, ApiError) else 0
            raise

    def _answered(self, call: Call, error: BaseException) -> None:
        call.status = error.status if isinstance(error, ApiError) else 0
        self.calls.append(call)

    def _stored(self, resource: Resource, namespace: str | None, name: str) -> JSON:
        found = self.obj(resource, namespace or "", name)
        if found is None:
            raise _not_found(resource, name)
        return found

    def _write(self, resource: Resource, namespace: str | None, current: JSON | None, body: JSON) -> JSON:
        """Store `body` over `current` (None: new), keeping server-owned metadata."""
        if current is not None:
            meta = body.setdefault("metadata", {})
            for key in SERVER_OWNED:
                if key in current["metadata"]:
                    meta[key] = current["metadata"][key]
        return self.put(resource, namespace or "", body)

    # --- the Kube surface ----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JSON:
        call = Call(method, path, body, dict(query or {}))
        self.calls.append(call)
        problem = self.fail(call)
        if problem is not None:
            call.status = problem.status if isinstance(problem, ApiError) else 0
            raise problem
        if path.startswith(API_GROUP_PATH) and method == "GET":
            if not self.served:
                call.status = 404
                raise NotFound(404, "NotFound", "404 page not found")
            return {"resources": [{"name": plural} for plural in sorted(self.served)]}
        if path.endswith("selfsubjectreviews"):
            return {"status": {"userInfo": {"username": self.username}}}
        raise AssertionError(f"unexpected request {method} {path}")

    def get(
        self, resource: Resource, namespace: str | None, name: str, subresource: str | None = None
    ) -> JSON:
        with self._call("GET", resource, namespace, name):
            return copy.deepcopy(self._stored(resource, namespace, name))

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        **query: Any,
    ) -> list[JSON]:
        with self._call("LIST", resource, namespace, query={"labelSelector": label_selector, **query}):
            fields = str(query.get("fieldSelector") or "")
            found = []
            for (plural, ns, _), body in sorted(self.objects.items()):
                if plural != resource.plural or (namespace and ns != namespace):
                    continue
                if label_selector and not _selected(body["metadata"].get("labels") or {}, label_selector):
                    continue
                if fields and not _fields_selected(body, fields):
                    continue
                found.append(copy.deepcopy(body))
            return found

    def create(self, resource: Resource, namespace: str | None, body: JSON) -> JSON:
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        if "name" not in meta and "generateName" in meta:
            meta["name"] = f"{meta['generateName']}{next(self._suffixes):05d}"
        with self._call("POST", resource, namespace, meta.get("name"), body=body):
            if self.obj(resource, namespace or "", meta["name"]) is not None:
                raise AlreadyExists(
                    409, "AlreadyExists", f'{resource.plural} "{meta["name"]}" already exists'
                )
            if resource in WITH_STATUS_SUBRESOURCE:
                body.pop("status", None)
            return self._write(resource, namespace, None, body)

    def replace(self, resource: Resource, namespace: str | None, name: str, body: JSON) -> JSON:
        """PUT: the body's metadata.resourceVersion is the precondition."""
        with self._call("PUT", resource, namespace, name, body=body):
            current = self._stored(resource, namespace, name)
            if (body.get("metadata") or {}).get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise _conflict(resource, name)
            stored = _status_kept(resource, current, copy.deepcopy(body))
            return self._write(resource, namespace, current, stored)

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
        """A JSON merge patch, applied only at `resource_version` when one is given."""
        with self._call(
            "PATCH",
            resource,
            namespace,
            name,
            subresource=subresource,
            body=patch,
            query={"rv": resource_version},
        ):
            current = self._stored(resource, namespace, name)
            if resource_version is not None and resource_version != current["metadata"]["resourceVersion"]:
                raise _conflict(resource, name)
            if subresource == "status":
                changes = {"status": patch["status"]} if "status" in patch else {}
            else:
                changes = {k: v for k, v in patch.items() if k != "status"}
                if resource not in WITH_STATUS_SUBRESOURCE and "status" in patch:
                    changes["status"] = patch["status"]
            return self._write(resource, namespace, current, merge_patch(current, changes))

    def json_patch(self, resource: Resource, namespace: str | None, name: str, ops: Sequence[JSON]) -> JSON:
        """RFC 6902 on the main resource (status stays as it is on resources with a subresource)."""
        with self._call("PATCH", resource, namespace, name, body=ops):
            current = self._stored(resource, namespace, name)
            patched = _status_kept(resource, current, json_patch_ops(current, ops))
            return self._write(resource, namespace, current, patched)

    def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        resource_version: str | None = None,
        propagation: str = "Background",
    ) -> JSON:
        with self._call("DELETE", resource, namespace, name):
            current = self._stored(resource, namespace, name)
            if resource_version is not None and resource_version != current["metadata"]["resourceVersion"]:
                raise _conflict(resource, name)
            with self._changed:
                key = (resource.plural, namespace or "", name)
                gone = self.objects.pop(key)
                gone = {**gone, "metadata": {**gone["metadata"], "resourceVersion": self._next_version()}}
                self._log_change(key, gone, None)
            return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def _changed_after(self, version: int, deadline: float) -> bool:
        return bool(self._changes and self._changes[-1][0] > version) or time.monotonic() >= deadline

    def list_at(
        self, resource: Resource, namespace: str | None = None, **query: Any
    ) -> tuple[Sequence[JSON], str]:
        with self._changed:
            label = query.pop("labelSelector", None)
            return self.list(resource, namespace, label, **query), str(self._last_version)

    def watch(
        self, resource: Resource, namespace: str | None, resource_version: str, *, seconds: int, **query: Any
    ) -> Iterator[WatchEvent]:
        """The changes after `resource_version` that the selectors see, until `seconds` pass."""
        self.calls.append(Call("WATCH", resource.path(namespace), None, dict(query)))
        labels = str(query.get("labelSelector") or "")
        fields = str(query.get("fieldSelector") or "")

        def seen(body: JSON | None) -> bool:
            if body is None:
                return False
            if labels and not _selected(body["metadata"].get("labels") or {}, labels):
                return False
            return not fields or _fields_selected(body, fields)

        deadline = time.monotonic() + seconds
        after = int(resource_version or 0)
        while True:
            with self._changed:
                waited = functools.partial(self._changed_after, after, deadline)
                self._changed.wait_for(waited, max(deadline - time.monotonic(), 0))
                pending = [change for change in self._changes if change[0] > after]
            if not pending and time.monotonic() >= deadline:
                return
            for version, plural, ns, before, now in pending:
                after = version
                if plural != resource.plural or (namespace and ns != namespace):
                    continue
                was, is_ = seen(before), seen(now)
                if is_:
                    yield WatchEvent("MODIFIED" if was else "ADDED", copy.deepcopy(now or {}))
                elif was:
                    gone = copy.deepcopy(before or {})
                    gone["metadata"]["resourceVersion"] = str(version)
                    yield WatchEvent("DELETED", gone)


# `make typecheck` checks this file (pyproject.toml, [tool.mypy] files): the fake has every call the
# product makes on an API client (k8s.api.KubeClient), with the real client's signatures.
_FAKE_IS_A_CLIENT: type[KubeClient] = FakeKube
