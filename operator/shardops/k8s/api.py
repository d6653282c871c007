"""Every call to the API server goes through `Kube.request`: JSON in, JSON out, typed errors, retries.

Product code that takes a client takes a `KubeClient`: the Protocol of the calls it makes, which the
real client (`Kube`) and the unit tests' in-memory API server (tests/fakekube.py) both satisfy —
checked by mypy for both (the end of this module, and the end of tests/fakekube.py), so neither can
drift from the other without `make typecheck` failing.

Request building is pure (`resource_path`, `merge_patch_with_precondition`); the only I/O is one
HTTP call on the kubernetes client's connection pool, which carries the kubeconfig's credentials.
Conflicts (409) are never retried here: the caller re-reads and decides, because a stale write
must not silently win (docs/architecture.md, "Fencing"). A write answered with a server error may
still have been applied (a 504 after etcd committed it), and its retry then meets its own write: the
error raised for such a write says so (`ApiError.ambiguous`), and `k8s.ambiguous` re-reads the
object to recognise it.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import RESTResponse

from shardops import API_GROUP, API_VERSION
from shardops.api.common import JSON
from shardops.api.names import CLUSTER_SOURCE_PLURAL, SOURCE_PLURAL

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
# Throttling: the API server refused the request before acting on it (max-in-flight or priority and
# fairness), so sending it again is safe whatever it was.
THROTTLED = 429
# Requests that change something: answered with a server error, they may have been applied anyway.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# What the HTTP transport itself may send again after a connection failed mid-answer: reads only.
REPEATABLE_BY_TRANSPORT = frozenset({"GET", "HEAD", "OPTIONS"})
# How long one request may wait for the API server's answer; 0 waits as long as it takes.
DEFAULT_TIMEOUT_SECONDS = 30.0
# The header that makes the API server act as another user (kubectl --as); the caller needs the
# `impersonate` verb on that user.
IMPERSONATE_USER_HEADER = "Impersonate-User"


class ApiError(Exception):
    """A non-2xx answer. `reason` is the Status reason (NotFound, Conflict, AlreadyExists, Invalid…).

    `ambiguous`: the answer does not tell whether the write was applied — a write answered with a
    server error, or refused (409, say) on a retry after a try that was answered with one."""

    def __init__(
        self, status: int, reason: str, message: str, body: JSON | None = None, *, ambiguous: bool = False
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}
        self.ambiguous = ambiguous


class WriteRefused(Exception):
    """A write this client's own guard stopped before sending it (`Kube.guarded`): nothing reached
    the API server. Not an ApiError, so code that handles refusals by the server lets it through."""


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409 from a resourceVersion precondition: someone else wrote first."""


class AlreadyExists(Conflict):
    pass


class Forbidden(ApiError):
    pass


class Invalid(ApiError):
    pass


class Gone(ApiError):
    """410: the resourceVersion a watch asked for is older than the API server keeps: list again."""


def _error_for(status: int, body: JSON, text: str) -> ApiError:
    reason = str(body.get("reason") or "")
    message = str(body.get("message") or text[:500])
    if status == 404:
        return NotFound(status, reason or "NotFound", message, body)
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExists(status, reason, message, body)
    if status == 409:
        return Conflict(status, reason or "Conflict", message, body)
    if status == 403:
        return Forbidden(status, reason or "Forbidden", message, body)
    if status == 422:
        return Invalid(status, reason or "Invalid", message, body)
    if status == 410:
        return Gone(status, reason or "Expired", message, body)
    return ApiError(status, reason or "Error", message, body)


@dataclass(frozen=True)
class WatchEvent:
    """One change a watch reports: ADDED, MODIFIED, DELETED (also when an object stops matching
    the selector), BOOKMARK (only the version moved) or ERROR (the object is a Status)."""

    type: str
    object: JSON

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion") or "")


def _parsed(raw: bytes) -> tuple[str, JSON]:
    """An answer's text and its JSON object ({} when it is none; a JSON list becomes its items)."""
    text = raw.decode("utf-8", errors="replace")
    if not text:
        return text, {}
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError:
        return text, {}
    return text, loaded if isinstance(loaded, dict) else {"items": loaded}


def json_lines(chunks: Iterable[bytes]) -> Iterator[JSON]:
    """The JSON objects of a stream sent one per line, whatever its chunks cut (a watch's body)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)


def watch_event(line: JSON) -> WatchEvent:
    """One line of a watch stream; an ERROR line raises what its Status says (410: Gone)."""
    kind = str(line.get("type") or "")
    body = line.get("object") if isinstance(line.get("object"), dict) else {}
    assert isinstance(body, dict)
    if kind == "ERROR":
        code = int(body.get("code") or 500)
        raise _error_for(code, body, str(body.get("message") or ""))
    return WatchEvent(kind, body)


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the REST tree."""

    group: str
    version: str
    plural: str

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        return resource_path(self, namespace, name, subresource)


CAMPAIGNS = Resource(API_GROUP, API_VERSION, "campaigns")
SHARDS = Resource(API_GROUP, API_VERSION, "shards")
SOURCES = Resource(API_GROUP, API_VERSION, SOURCE_PLURAL)
CLUSTER_SOURCES = Resource(API_GROUP, API_VERSION, CLUSTER_SOURCE_PLURAL)
LEASES = Resource("coordination.k8s.io", "v1", "leases")
JOBS = Resource("batch", "v1", "jobs")
PODS = Resource("", "v1", "pods")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("events.k8s.io", "v1", "events")


def resource_path(
    resource: Resource, namespace: str | None = None, name: str | None = None, subresource: str | None = None
) -> str:
    prefix = (
        f"/api/{resource.version}" if not resource.group else f"/apis/{resource.group}/{resource.version}"
    )
    parts = [prefix]
    if namespace:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(resource.plural)
    if name:
        parts.append(quote(name, safe=""))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def retry_is_safe(method: str, body: Any, status: int) -> bool:
    """May a request answered `status` be sent again? A 5xx (504 above all) can come after the API
    server committed the write, so only a request whose repetition cannot make a second object goes
    again: reads, writes and deletes of a named object (repeated, a committed write either lands the
    same content again or fails its precondition with 409/422, and the caller re-reads), and a create
    that names its object (repeated, it gets 409 AlreadyExists, which the caller takes as made). A
    create by `generateName` alone would make a second object under another name: not repeated
    after a 5xx. Every create of shardops names its object (Shards, Leases, Events, worker Jobs,
    result ConfigMaps)."""
    if status not in RETRYABLE_STATUSES:
        return False
    if status == THROTTLED or method != "POST":
        return True
    metadata = body.get("metadata") if isinstance(body, Mapping) else None
    return isinstance(metadata, Mapping) and bool(metadata.get("name"))


def merge_patch_with_precondition(patch: JSON, resource_version: str | None) -> JSON:
    """A merge patch that the server applies only if the object is still at `resource_version`."""
    if resource_version is None:
        return patch
    metadata = dict(patch.get("metadata") or {})
    metadata["resourceVersion"] = resource_version
    return {**patch, "metadata": metadata}


@dataclass
class RetryPolicy:
    attempts: int = 5
    base_seconds: float = 0.2
    cap_seconds: float = 5.0
    sleep: Callable[[float], None] = time.sleep
    rand: Callable[[], float] = field(default_factory=lambda: random.Random().random)

    def delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after and retry_after.isdigit():
            return min(float(retry_after), self.cap_seconds)
        jitter: float = 0.5 + self.rand() * 0.5
        return min(self.base_seconds * 2.0 ** (attempt - 1), self.cap_seconds) * jitter


RequestObserver = Callable[[str, str, int], None]
# Called with (method, path) before each attempt of a write; raises WriteRefused to stop it unsent.
WriteGuard = Callable[[str, str], None]


class KubeClient(Protocol):
    """The calls product code makes on an API client: `Kube` (the real one) and tests/fakekube.py's
    `FakeKube` both have them, with these signatures (mypy checks both). A call product code needs
    that is not here is added here first, then to both."""

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JSON: ...

    def get(
        self, resource: Resource, namespace: str | None, name: str, subresource: str | None = None
    ) -> JSON: ...

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        **query: str | int,
    ) -> list[JSON]: ...

    def list_at(
        self, resource: Resource, namespace: str | None = None, **query: str | int
    ) -> tuple[Sequence[JSON], str]: ...

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        *,
        seconds: int,
        **query: str | int,
    ) -> Iterator[WatchEvent]: ...

    def create(self, resource: Resource, namespace: str | None, body: JSON) -> JSON: ...

    def replace(self, resource: Resource, namespace: str | None, name: str, body: JSON) -> JSON: ...

    def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: JSON,
        *,
        resource_version: str | None = None,
        subresource: str | None = None,
    ) -> JSON: ...

    def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: Sequence[JSON]
    ) -> JSON: ...

    def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        resource_version: str | None = None,
        propagation: str = "Background",
    ) -> JSON: ...


class Kube:
    """A thin JSON client. `field_manager` names who writes (it shows up in managedFields); `timeout`
    bounds each request in seconds (0: no bound)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        field_manager: str,
        retry: RetryPolicy | None = None,
        observer: RequestObserver | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        write_guard: WriteGuard | None = None,
    ) -> None:
        self.api_client = api_client
        self.field_manager = field_manager
        self.retry = retry or RetryPolicy()
        self.observer = observer
        self.timeout = timeout
        self.write_guard = write_guard

    def guarded(self, guard: WriteGuard) -> Kube:
        """This client (same connections, credentials, retries) with every write, and every retry
        of one, first passed to `guard(method, path)`, which may refuse it (WriteRefused)."""
        return Kube(
            self.api_client, self.field_manager, self.retry, self.observer, self.timeout, write_guard=guard
        )

    @classmethod
    def from_environment(
        cls,
        field_manager: str,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        impersonate: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        connections: int | None = None,
    ) -> Kube:
        """In-cluster config when running in a pod with a token mount, else the kubeconfig: its
        current-context, or `context`. `impersonate`: the user every request acts as.
        `connections`: the most kept open at once, for a caller with that many threads (the
        client's default, 5 per CPU of the node, is unrelated to how many threads call it)."""
        configuration = client.Configuration()
        # urllib3 would send a PUT or DELETE again on its own after a connection closed mid-answer;
        # if the first one was applied, the copy meets 409 and the write reads as a lost race. Only
        # reads are repeated down there; a write's lost answer reaches `Kube.request`'s caller, which
        # re-reads and recognises its own write (`k8s.ambiguous`). Connect errors (nothing was sent)
        # are still retried for every method.
        configuration.retries = urllib3.util.Retry(total=3, allowed_methods=REPEATABLE_BY_TRANSPORT)
        if connections is not None:
            configuration.connection_pool_maxsize = connections
        try:
            if kubeconfig or context:
                raise config.ConfigException("explicit kubeconfig or context")
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        api_client = client.ApiClient(configuration)
        if impersonate:
            api_client.set_default_header(IMPERSONATE_USER_HEADER, impersonate)  # type: ignore[no-untyped-call]
        return cls(api_client, field_manager, timeout=timeout)

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
        """One call, retried on throttling and on server errors where repeating it is safe
        (`retry_is_safe`). `timeout`: seconds for this call (0: no bound), instead of the client's."""
        bound = self.timeout if timeout is None else timeout
        params = dict(query or {})
        if method in ("POST", "PUT", "PATCH") and "fieldManager" not in params:
            params["fieldManager"] = self.field_manager
        attempt = 0
        # A try of this write was answered with a server error: it may have been applied.
        maybe_applied = False
        while True:
            attempt += 1
            if self.write_guard is not None and method in WRITE_METHODS:
                self.write_guard(method, path)
            response = self._send(method, path, params, bound or None, body=body, content_type=content_type)
            raw: bytes = response.read() or b""  # type: ignore[no-untyped-call]
            if self.observer:
                self.observer(method, path, response.status)
            text, parsed = _parsed(raw)
            if 200 <= response.status < 300:
                return parsed
            if method in WRITE_METHODS and response.status >= 500:
                maybe_applied = True
            if retry_is_safe(method, body, response.status) and attempt < self.retry.attempts:
                retry_after = response.getheader("Retry-After")  # type: ignore[no-untyped-call]
                delay = self.retry.delay(attempt, retry_after)
                log.debug("%s %s -> %s; retrying in %.2fs", method, path, response.status, delay)
                self.retry.sleep(delay)
                continue
            error = _error_for(response.status, parsed, text)
            error.ambiguous = maybe_applied
            raise error

    def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str | int | bool],
        timeout: float | tuple[float | None, float] | None,
        *,
        body: Any = None,
        content_type: str | None = None,
    ) -> RESTResponse:
        """One HTTP exchange, serialized as the generated client does it (its auth, query encoding and
        body encoding), unread: `request` reads the answer whole, `watch` as a stream. `timeout`: as
        urllib3 takes it (seconds, or connect and read seconds; None: no bound)."""
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        _, url, sent_headers, serialized, _ = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(params.items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api_client.call_api(
            method, url, header_params=sent_headers, body=serialized, _request_timeout=timeout
        )

    # Conveniences over request(); each is one call.
    def get(
        self, resource: Resource, namespace: str | None, name: str, subresource: str | None = None
    ) -> JSON:
        return self.request("GET", resource.path(namespace, name, subresource))

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        **query: str | int,
    ) -> list[JSON]:
        params: dict[str, str | int | bool] = dict(query)
        if label_selector:
            params["labelSelector"] = label_selector
        items: list[JSON] = []
        while True:
            page = self.request("GET", resource.path(namespace), query=params)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params["continue"] = token

    def list_at(
        self, resource: Resource, namespace: str | None = None, **query: str | int
    ) -> tuple[Sequence[JSON], str]:
        """The objects a selector picks and the resourceVersion the list was read at: where a watch
        that follows the list starts. One page: the callers select a bounded set (they say which)."""
        page = self.request("GET", resource.path(namespace), query=dict(query))
        return list(page.get("items") or []), str((page.get("metadata") or {}).get("resourceVersion") or "")

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        *,
        seconds: int,
        **query: str | int,
    ) -> Iterator[WatchEvent]:
        """The changes after `resource_version` of the objects the query selects, as the API server
        sends them, for at most `seconds` (the server ends the watch then; the caller starts another
        from the last version it saw). Bookmarks are asked for, so an idle watch still advances its
        version. An expired version ends in `Gone` (410): the caller lists again."""
        params: dict[str, str | int | bool] = {
            **query,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": seconds,
        }
        path = resource.path(namespace)
        # The read timeout covers the quiet between two events: bookmarks come about once a minute.
        response = self._send("GET", path, params, (self.timeout or None, seconds + 30))
        if self.observer:
            self.observer("WATCH", path, response.status)
        if not 200 <= response.status < 300:
            text, parsed = _parsed(response.read() or b"")  # type: ignore[no-untyped-call]
            raise _error_for(response.status, parsed, text)
        stream = response.response
        try:
            for line in json_lines(stream.stream(64 * 1024, decode_content=True)):
                yield watch_event(line)
        finally:
            stream.release_conn()

    def create(self, resource: Resource, namespace: str | None, body: JSON) -> JSON:
        return self.request("POST", resource.path(namespace), body=body)

    def replace(self, resource: Resource, namespace: str | None, name: str, body: JSON) -> JSON:
        """PUT: the body's metadata.resourceVersion is the precondition."""
        return self.request("PUT", resource.path(namespace, name), body=body)

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
        return self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            body=merge_patch_with_precondition(patch, resource_version),
            content_type=MERGE_PATCH,
        )

    def json_patch(self, resource: Resource, namespace: str | None, name: str, ops: Sequence[JSON]) -> JSON:
        """An RFC 6902 JSON patch: for edits of one list entry (a finalizer) that a merge patch, which
        replaces whole lists, cannot make without racing. A failed `test` op is 422 (Invalid)."""
        return self.request("PATCH", resource.path(namespace, name), body=list(ops), content_type=JSON_PATCH)

    def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        resource_version: str | None = None,
        propagation: str = "Background",
    ) -> JSON:
        body: JSON = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        return self.request("DELETE", resource.path(namespace, name), body=body)


if TYPE_CHECKING:
    # mypy proves that the real client has every call of KubeClient, with its signature.
    _KUBE_IS_A_CLIENT: type[KubeClient] = Kube
