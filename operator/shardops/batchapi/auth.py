"""Who calls: `Authorization: Bearer <ServiceAccount token>` (`kubectl create token NAME -n TEAM`).

A TokenReview says whose token it is; only a ServiceAccount's (`system:serviceaccount:NS:NAME`) is
taken, and its namespace NS is the only one the caller reaches. A SubjectAccessReview then asks the
cluster whether that identity may `create campaigns` in NS: the cluster's RBAC decides, the service
keeps no tokens of its own, and expiry and rotation are Kubernetes'. Answers are cached for a short
time (a revoked binding takes effect within `ttl_seconds`), in a bounded map keyed by the token's
sha256 (the token itself is never kept). The calls block: run `Reviewer.tenant` on an executor.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from shardops import API_GROUP
from shardops.api.common import JSON

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

# POST `path` with a JSON body, the answer's JSON (Kube.request in production).
Post = Callable[[str, JSON], JSON]


@dataclass(frozen=True)
class Tenant:
    namespace: str
    service_account: str


def service_account_of(username: str) -> Tenant | None:
    """The ServiceAccount a TokenReview's username names; None for any other identity."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, _, name = username[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
    return Tenant(namespace, name) if namespace and name else None


def token_review(token: str) -> JSON:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def access_review(user: JSON, namespace: str) -> JSON:
    """May `user` (a TokenReview's status.user) create campaigns in `namespace`?"""
    spec: JSON = {
        "user": user.get("username"),
        "groups": user.get("groups") or [],
        "resourceAttributes": {
            "namespace": namespace,
            "verb": "create",
            "group": API_GROUP,
            "resource": "campaigns",
        },
    }
    if user.get("uid"):
        spec["uid"] = user["uid"]
    if user.get("extra"):
        spec["extra"] = user["extra"]
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


class Reviewer:
    """Tenant of a token, or None (the caller answers 401), through the two reviews, cached."""

    def __init__(
        self,
        post: Post,
        *,
        ttl_seconds: float = 30.0,
        max_entries: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._post = post
        self._ttl = ttl_seconds
        self._max = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        # sha256(token) -> (expiry, tenant or None); bounded by max_entries, least recently used out.
        self._cache: OrderedDict[str, tuple[float, Tenant | None]] = OrderedDict()

    def tenant(self, token: str) -> Tenant | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                self._cache.move_to_end(key)
                return cached[1]
        tenant = self._review(token)
        with self._lock:
            self._cache[key] = (now + self._ttl, tenant)
            self._cache.move_to_end(key)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return tenant

    def _review(self, token: str) -> Tenant | None:
        status = self._post(TOKEN_REVIEWS, token_review(token)).get("status") or {}
        user = status.get("user") or {}
        if not status.get("authenticated"):
            return None
        tenant = service_account_of(str(user.get("username") or ""))
        if tenant is None:
            return None
        allowed = self._post(ACCESS_REVIEWS, access_review(user, tenant.namespace)).get("status") or {}
        return tenant if allowed.get("allowed") else None
